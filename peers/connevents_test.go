package peers

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/test/testcerts"
)

// A connection the server closes before its first request (the asker gone during the
// handshake) is counted by kind, with Go's server's own log line, without its address.
func TestServerConnEventsAreCounted(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "nodes-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.NodeServing(dir, "node-0", net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := ServerTLS(serving, "", ca.File)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	stats := &Stats{}
	s := &Server{Mirror: http.NotFoundHandler(), Stats: stats}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, addr, srvTLS) }()
	defer func() { cancel(); <-done }()
	var c net.Conn
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err = net.Dial("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("not a TLS hello\r\n\r\n"))
	c.Close()
	const closed = "server closed a connection before its first request (handshake not complete)"
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ev := stats.ConnEvents()
		handshake := false
		for k := range ev {
			if strings.HasPrefix(k, "server http: TLS handshake error") {
				handshake = true
				if strings.Contains(k, "127.0.0.1") {
					t.Fatalf("the kind names the address: %q", k)
				}
			}
		}
		if ev[closed] == 1 && handshake {
			return
		}
	}
	t.Fatalf("events %v, want %q once and a handshake error", stats.ConnEvents(), closed)
}

// Go's server's log lines are counted by kind, the peer's address left out.
func TestServerLogLinesAreCountedByKind(t *testing.T) {
	stats := &Stats{}
	l := serverLog{stats: stats, s: &Server{}}
	for _, line := range []string{
		"http: TLS handshake error from 127.0.0.1:41234: EOF\n",
		"http: TLS handshake error from 10.0.0.5:1: EOF\n",
		"timeout waiting for SETTINGS frames from 127.0.0.1:32876\n",
	} {
		l.Write([]byte(line))
	}
	got := stats.ConnEvents()
	if len(got) != 2 || got["server http: TLS handshake error: EOF"] != 2 || got["server timeout waiting for SETTINGS frames"] != 1 {
		t.Fatalf("%v", got)
	}
}
