package endpoint

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// The CA's files in the state directory.
const (
	CAKeyFile  = "tag-mirror-ca.key"
	CACertFile = "tag-mirror-ca.crt"
)

// CA is the node-local CA of the tag endpoint: created once, kept in the state
// directory, its key readable by root alone.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey

	mu   sync.Mutex
	leaf map[string]*tls.Certificate
}

// LoadCA reads the CA from dir, creating it when it is missing (or unreadable: a new
// CA, which Trust then hands to CRI-O in place of the old one).
func LoadCA(dir string) (*CA, error) {
	keyPath, certPath := filepath.Join(dir, CAKeyFile), filepath.Join(dir, CACertFile)
	// A broken CA is replaced: nothing but CRI-O's certs.d depends on it.
	if ca, err := readCA(keyPath, certPath); err == nil {
		return ca, nil
	}
	ca, keyPEM, err := newCA()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := fsutil.WriteAtomic(keyPath, dir, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write the tag mirror's CA key: %w", err)
	}
	if err := fsutil.WriteAtomic(certPath, dir, ca.certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("write the tag mirror's CA certificate: %w", err)
	}
	return ca, nil
}

func readCA(keyPath, certPath string) (*CA, error) {
	keyPEM, err := fsutil.ReadRegular(keyPath, 64<<10)
	if err != nil {
		return nil, err
	}
	certPEM, err := fsutil.ReadRegular(certPath, 64<<10)
	if err != nil {
		return nil, err
	}
	kb, _ := pem.Decode(keyPEM)
	cb, _ := pem.Decode(certPEM)
	if kb == nil || cb == nil {
		return nil, errors.New("not PEM")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) || !cert.IsCA || time.Until(cert.NotAfter) < 30*24*time.Hour {
		return nil, errors.New("the key and certificate do not make a valid CA")
	}
	// Only root reads the key, whatever an earlier hand left.
	if err := os.Chmod(keyPath, 0o600); err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: certPEM, key: key, leaf: map[string]*tls.Certificate{}}, nil
}

func newCA() (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "imagepind node-local tag mirror CA " + host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(20, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	ca := &CA{cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key, leaf: map[string]*tls.Certificate{}}
	return ca, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// PEM is the CA's certificate, what CRI-O is given to trust.
func (ca *CA) PEM() []byte { return bytes.Clone(ca.certPEM) }

// ServerTLS is the endpoint's TLS config for host (an IP or a name): a certificate the
// CA signs, made in memory (never written) and made again a month before it expires.
func (ca *CA) ServerTLS(host string) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.certificate(host)
	}}
}

func (ca *CA) certificate(host string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c := ca.leaf[host]; c != nil && time.Until(c.Leaf.NotAfter) > 30*24*time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	ca.leaf[host] = c
	return c, nil
}
