package nodecert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pemPair is a self-signed certificate for cn and its key, one PEM.
func pemPair(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})...)
}

func cnOf(t *testing.T, load func() (*tls.Certificate, error)) string {
	t.Helper()
	c, err := load()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

// The kubelet rotates its certificate by writing a new file and pointing the
// -current.pem symlink at it: the next call takes the new one; an unchanged pair is not
// parsed again; a pair that does not load leaves the last good one in use.
func TestKeyPairFollowsRotationAndParsesOnce(t *testing.T) {
	dir := t.TempDir()
	current := filepath.Join(dir, "kubelet-client-current.pem")
	write := func(name string, data []byte) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := current + ".tmp"
		if err := os.Symlink(p, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, current); err != nil {
			t.Fatal(err)
		}
	}
	write("kubelet-client-1.pem", pemPair(t, "system:node:one"))
	load := KeyPair(current, "")
	if got := cnOf(t, load); got != "system:node:one" {
		t.Fatalf("first load: %s", got)
	}
	a, _ := load()
	b, _ := load()
	if a != b {
		t.Fatal("an unchanged pair was parsed again")
	}

	write("kubelet-client-2.pem", pemPair(t, "system:node:two"))
	if got := cnOf(t, load); got != "system:node:two" {
		t.Fatalf("after rotation: %s, want system:node:two", got)
	}

	// Rewritten in place, same name, other content (a size or time that differs).
	if err := os.WriteFile(filepath.Join(dir, "kubelet-client-2.pem"), pemPair(t, "system:node:three"), 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	os.Chtimes(filepath.Join(dir, "kubelet-client-2.pem"), future, future)
	if got := cnOf(t, load); got != "system:node:three" {
		t.Fatalf("after a rewrite in place: %s, want system:node:three", got)
	}

	write("kubelet-client-3.pem", []byte("half written"))
	if got := cnOf(t, load); got != "system:node:three" {
		t.Fatalf("a broken pair: %s, want the last good one", got)
	}
	write("kubelet-client-4.pem", pemPair(t, "system:node:four"))
	if got := cnOf(t, load); got != "system:node:four" {
		t.Fatalf("after the broken pair was replaced: %s", got)
	}

	if _, err := KeyPair(filepath.Join(dir, "missing.pem"), "")(); err == nil {
		t.Fatal("a pair that never loaded gave no error")
	}
}
