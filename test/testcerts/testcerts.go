// Package testcerts makes the certificates tests need: a CA, a serving certificate for
// 127.0.0.1, and kubelet-style node client certificates (CN system:node:<name>,
// O system:nodes) written as one PEM with the key, as kubelet-client-current.pem is.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// File is the CA certificate's PEM file.
	File string
}

// NewCA makes a CA and writes its certificate to dir/name.crt.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{Cert: cert, Key: key, File: filepath.Join(dir, name+".crt")}
	return ca, os.WriteFile(ca.File, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return n
}

// issue signs a leaf and writes cert and key to certFile and keyFile (the same path for
// one combined PEM).
func (ca *CA) issue(tmpl *x509.Certificate, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if certFile == keyFile {
		return os.WriteFile(certFile, append(certPEM, keyPEM...), 0o600)
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyFile, keyPEM, 0o600)
}

// Server issues a serving certificate for 127.0.0.1 and localhost.
func (ca *CA) Server(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	err = ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: name}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, certFile, keyFile)
	return certFile, keyFile, err
}

// Node issues a kubelet-style client certificate for node, as one PEM file.
func (ca *CA) Node(dir, node string) (string, error) {
	return ca.Client(dir, node, "system:node:"+node, "system:nodes")
}

// Client issues a client certificate with any CN and organization, as one PEM file.
func (ca *CA) Client(dir, file, cn, org string) (string, error) {
	p := filepath.Join(dir, file+".pem")
	return p, ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: cn, Organization: []string{org}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, p, p)
}

// HTTPClient is an HTTPS client that trusts this CA and, with clientPEM set (a file
// from Client or Node), presents that certificate.
func (ca *CA) HTTPClient(clientPEM string) (*http.Client, error) {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if clientPEM != "" {
		cert, err := tls.LoadX509KeyPair(clientPEM, clientPEM)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}, nil
}

// NodeServing issues a kubelet-style serving certificate for node (CN system:node:<node>,
// O system:nodes, for ips), as one PEM file with its key (kubelet-server-current.pem).
func (ca *CA) NodeServing(dir, node string, ips ...net.IP) (string, error) {
	p := filepath.Join(dir, node+"-serving.pem")
	return p, ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		IPAddresses: ips, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, p, p)
}

// SplitKey writes a combined PEM (certificate and key, as Node, Client and NodeServing
// write them) as two files, as k3s and RKE2 keep the kubelet's: <base>.crt and
// <base>.key beside it.
func SplitKey(combined string) (certFile, keyFile string, err error) {
	data, err := os.ReadFile(combined)
	if err != nil {
		return "", "", err
	}
	var certPEM, keyPEM []byte
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			certPEM = append(certPEM, pem.EncodeToMemory(b)...)
		} else {
			keyPEM = append(keyPEM, pem.EncodeToMemory(b)...)
		}
	}
	base := strings.TrimSuffix(combined, filepath.Ext(combined))
	certFile, keyFile = base+".crt", base+".key"
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, keyPEM, 0o600)
}
