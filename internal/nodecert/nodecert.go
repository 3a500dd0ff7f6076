// Package nodecert reads a node's identity from a verified client certificate, as the
// API server does for kubelets: CN system:node:<name>, O system:nodes. The aggregator
// checks it on reports, and a node on its peers' requests. It also loads a node's own
// certificate and key from where the kubelet keeps them (KeyPair).
package nodecert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"slices"
	"strings"

	"github.com/imagepin/imagepin/internal/reload"
)

const (
	cnPrefix = "system:node:"
	group    = "system:nodes"
)

// ErrNone means no verified client certificate was presented.
var ErrNone = errors.New("no verified node client certificate")

// Name is the node name of a verified chain's leaf, or why it is not a node's.
func Name(verified [][]*x509.Certificate) (string, error) {
	if len(verified) == 0 || len(verified[0]) == 0 {
		return "", ErrNone
	}
	leaf := verified[0][0]
	cn := leaf.Subject.CommonName
	if !strings.HasPrefix(cn, cnPrefix) || len(cn) == len(cnPrefix) {
		return "", errors.New("client certificate CN " + cn + " is not system:node:<name>")
	}
	if !slices.Contains(leaf.Subject.Organization, group) {
		return "", errors.New("client certificate of " + cn + " is not in group system:nodes")
	}
	return strings.TrimPrefix(cn, cnPrefix), nil
}

// KeyPair loads a certificate and its key, again whenever either file changed
// (package reload: the kubelet rotates by pointing a symlink at a new file), so a
// certificate the kubelet rotated is taken at the next handshake. keyFile "" means the
// key is in certFile: one PEM, as the kubelet keeps kubelet-client-current.pem and
// kubelet-server-current.pem; k3s and RKE2 keep the key apart (client-kubelet.crt and
// client-kubelet.key). A pair that does not load leaves the last one that did in use.
//
// Parsed at every handshake, the pair was 15 % of the handshakes' CPU in the scale
// bench at 500 nodes.
func KeyPair(certFile, keyFile string) func() (*tls.Certificate, error) {
	if keyFile == "" {
		keyFile = certFile
	}
	pair := reload.New(func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		return &c, nil
	}, certFile, keyFile)
	return pair.Get
}
