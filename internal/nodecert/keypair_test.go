package nodecert

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/imagepin/imagepin/test/testcerts"
)

// The kubelet rotates its certificate by writing a new file and pointing the
// -current.pem symlink at it: the next call takes the new one; an unchanged pair is not
// parsed again; a pair that does not load leaves the last good one in use.
func TestKeyPairFollowsRotationAndParsesOnce(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	current := filepath.Join(dir, "kubelet-client-current.pem")
	point := func(p string) {
		t.Helper()
		tmp := current + ".tmp"
		if err := os.Symlink(p, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, current); err != nil {
			t.Fatal(err)
		}
	}
	issue := func(node string) string {
		t.Helper()
		p, err := ca.Node(dir, node)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cn := func(load func() (*tls.Certificate, error)) string {
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

	point(issue("one"))
	load := KeyPair(current, "")
	if got := cn(load); got != "system:node:one" {
		t.Fatalf("first load: %s", got)
	}
	a, _ := load()
	b, _ := load()
	if a != b {
		t.Fatal("an unchanged pair was parsed again")
	}

	two := issue("two")
	point(two)
	if got := cn(load); got != "system:node:two" {
		t.Fatalf("after rotation: %s, want system:node:two", got)
	}

	// Rewritten in place: same name, other content and time.
	three, _ := os.ReadFile(issue("three"))
	if err := os.WriteFile(two, three, 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	os.Chtimes(two, future, future)
	if got := cn(load); got != "system:node:three" {
		t.Fatalf("after a rewrite in place: %s, want system:node:three", got)
	}

	broken := filepath.Join(dir, "broken.pem")
	os.WriteFile(broken, []byte("half written"), 0o600)
	point(broken)
	if got := cn(load); got != "system:node:three" {
		t.Fatalf("a broken pair: %s, want the last good one", got)
	}
	point(issue("four"))
	if got := cn(load); got != "system:node:four" {
		t.Fatalf("after the broken pair was replaced: %s", got)
	}

	if _, err := KeyPair(filepath.Join(dir, "missing.pem"), "")(); err == nil {
		t.Fatal("a pair that never loaded gave no error")
	}
}
