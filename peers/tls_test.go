package peers

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: srvTLS, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	})}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	resp, err := client.Get("https://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "system:node:node-1" {
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
