package peers

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/imagepin/imagepin/internal/nodecert"
	"github.com/imagepin/imagepin/test/testcerts"
)

// k3s and RKE2 keep the kubelet's certificates and keys in two files each
// (serving-kubelet.crt and .key, client-kubelet.crt and .key): both sides of a peer
// connection take them so.
func TestKeysApartAsK3sKeepsThem(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	servingPEM, err := ca.NodeServing(dir, "node-0", net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	clientPEM, err := ca.Node(dir, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	servingCrt, servingKey, err := testcerts.SplitKey(servingPEM)
	if err != nil {
		t.Fatal(err)
	}
	clientCrt, clientKey, err := testcerts.SplitKey(clientPEM)
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := ServerTLS(servingCrt, servingKey, ca.File)
	if err != nil {
		t.Fatal(err)
	}
	client, err := Client(clientCrt, clientKey, ca.File)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, srvTLS, commonName)
	if b, err := body(client, addr); err != nil || b != "system:node:node-1" {
		t.Fatalf("the server saw %q, %v", b, err)
	}

	// A certificate file without its key, and no key file: refused at start, naming it.
	if _, err := ServerTLS(servingCrt, "", ca.File); err == nil {
		t.Fatal("a serving certificate without its key was taken")
	}
	if _, err := Client(clientCrt, "", ca.File); err == nil {
		t.Fatal("a client certificate without its key was taken")
	}
}

// A node's second connection to a peer resumes its TLS session: no certificate is
// signed or verified again, and the peer still knows the node by its verified client
// certificate. A CA taken out of the peer's bundle is not outlived by a session: the
// next connection's resumption is refused and its full handshake fails.
func TestASecondConnectionResumesItsSession(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.NodeServing(dir, "node-0", net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	clientPEM, err := ca.Node(dir, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	clients := filepath.Join(dir, "client-ca.pem")
	caPEM, _ := os.ReadFile(ca.File)
	otherPEM, _ := os.ReadFile(other.File)
	if err := os.WriteFile(clients, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	srvTLS, err := ServerTLS(serving, "", clients)
	if err != nil {
		t.Fatal(err)
	}
	client, err := Client(clientPEM, "", ca.File)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, srvTLS, func(w http.ResponseWriter, r *http.Request) {
		name, err := nodecert.Name(r.TLS.VerifiedChains)
		fmt.Fprintf(w, "%s %v %v", name, err, r.TLS.DidResume)
	})
	get := func() (string, error) {
		client.CloseIdleConnections() // a new connection each time
		return body(client, addr)
	}
	for i, want := range []string{"node-1 <nil> false", "node-1 <nil> true", "node-1 <nil> true"} {
		got, err := get()
		if err != nil || got != want {
			t.Fatalf("connection %d: the peer saw %q (%v), want %q", i+1, got, err, want)
		}
	}
	// The node's CA leaves the peer's client bundle.
	if err := os.WriteFile(clients, otherPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	os.Chtimes(clients, future, future)
	if got, err := get(); err == nil {
		t.Fatalf("after its CA left the peer's bundle, a connection was taken: %q", got)
	}
}

// serveTLS serves h over TLS with cfg on a loopback port until the test ends, and
// returns its address.
func serveTLS(t *testing.T, cfg *tls.Config, h http.HandlerFunc) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: cfg, Handler: h}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// body is what client gets at https://addr/.
func body(client *http.Client, addr string) (string, error) {
	resp, err := client.Get("https://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// commonName answers the client certificate's CN.
func commonName(w http.ResponseWriter, r *http.Request) {
	fmt.Fprint(w, r.TLS.PeerCertificates[0].Subject.CommonName)
}
