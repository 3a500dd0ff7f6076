package peers

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/imagepin/imagepin/test/testcerts"
)

// A CA rotated on disk (a new CA added to the bundles) is taken at the next handshake
// on both sides, without a restart: before, the bundles were read once at start and
// sharing stopped, silently, until imagepind restarted.
func TestRotatedCAsAreTakenWithoutARestart(t *testing.T) {
	dir := t.TempDir()
	oldCA, err := testcerts.NewCA(dir, "old-ca")
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := testcerts.NewCA(dir, "new-ca")
	if err != nil {
		t.Fatal(err)
	}
	// Both nodes' certificates are already from the new CA; the bundles still hold the
	// old one only.
	serving, err := newCA.NodeServing(dir, "node-0", net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := newCA.Node(dir, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	roots, clients := filepath.Join(dir, "peers-ca.pem"), filepath.Join(dir, "client-ca.pem")
	oldPEM, _ := os.ReadFile(oldCA.File)
	newPEM, _ := os.ReadFile(newCA.File)
	for _, f := range []string{roots, clients} {
		os.WriteFile(f, oldPEM, 0o644)
	}
	srvTLS, err := ServerTLS(serving, "", clients)
	if err != nil {
		t.Fatal(err)
	}
	client, err := Client(clientCert, "", roots)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, srvTLS, commonName)
	get := func() (string, error) { return body(client, addr) }
	if _, err := get(); err == nil {
		t.Fatal("a peer whose CA is in no bundle was trusted")
	}

	// The rotation: each bundle gets the new CA beside the old.
	for _, f := range []string{roots, clients} {
		os.WriteFile(f, append(append([]byte{}, oldPEM...), newPEM...), 0o644)
	}
	got, err := get()
	if err != nil || got != "system:node:node-1" {
		t.Fatalf("after the rotation: %q, %v", got, err)
	}

	// A bundle broken on disk keeps the last good one.
	os.WriteFile(roots, []byte("not a certificate"), 0o644)
	client.CloseIdleConnections()
	if got, err := get(); err != nil || got != "system:node:node-1" {
		t.Fatalf("with a broken bundle: %q, %v", got, err)
	}
}
