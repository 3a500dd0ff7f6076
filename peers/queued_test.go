package peers

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
)

// A request that hears nothing from a peer while the peer's connection brings bytes for
// the node's other requests waits behind them: it is not left as a silent peer (set
// aside, the node climbing past it) at the stall bound, only once it has heard nothing
// for queuedFor. The requests to a peer share one connection, read at the node's
// download speed: while that is full, an answer's first bytes wait in the connection's
// buffers behind the others'. A peer that sends nothing on any request is still left at
// the stall bound.
func TestARequestQueuedBehindOthersIsNotSilent(t *testing.T) {
	oldStall, oldQueued := stallAfter, queuedFor
	stallAfter, queuedFor = 300*time.Millisecond, 2*time.Second
	t.Cleanup(func() { stallAfter, queuedFor = oldStall, oldQueued })
	busy := digest.FromString("busy")
	late := digest.FromString("late")
	never := digest.FromString("never")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, busy.String()):
			// A long answer, its bytes coming all along.
			for range 70 {
				if _, err := w.Write([]byte("x")); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
			}
		case strings.HasSuffix(r.URL.Path, late.String()):
			time.Sleep(time.Second) // its first byte behind the others' (the stall bound is 0.3 s)
			w.Write([]byte("late"))
		default:
			<-r.Context().Done()
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	node := strings.TrimPrefix(srv.URL, "https://")
	src := NewSource("", func() []string { return []string{node} }, nil, srv.Client(), &Stats{}, logrus.New())

	t.Run("behind others", func(t *testing.T) {
		resp, err := src.get(context.Background(), node, repo, "blobs", nil, busy, 0, false, false)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		go io.Copy(io.Discard, resp.Body)
		start := time.Now()
		resp2, err := src.get(context.Background(), node, repo, "blobs", nil, late, 0, false, false)
		if err != nil {
			t.Fatalf("a request behind another's bytes on the peer's connection was left after %s: %v", time.Since(start).Round(time.Millisecond), err)
		}
		resp2.Body.Close()
	})

	t.Run("alone", func(t *testing.T) {
		time.Sleep(2 * stallAfter) // nothing heard from the peer for longer than the bound
		start := time.Now()
		_, err := src.get(context.Background(), node, repo, "blobs", nil, never, 0, false, false)
		if !errors.Is(err, errSilent) {
			t.Fatalf("a peer sending nothing on any request: %v, want it silent", err)
		}
		if took := time.Since(start); took > 4*stallAfter {
			t.Errorf("a peer sending nothing on any request was left after %s, want about %s", took, stallAfter)
		}
	})

	t.Run("hanging one while answering others", func(t *testing.T) {
		resp, err := src.get(context.Background(), node, repo, "blobs", nil, busy, 0, false, false)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		go io.Copy(io.Discard, resp.Body)
		start := time.Now()
		_, err = src.get(context.Background(), node, repo, "blobs", nil, never, 0, false, false)
		if !errors.Is(err, errSilent) {
			t.Fatalf("a request the peer hangs while answering another: %v, want it silent", err)
		}
		if took := time.Since(start); took < queuedFor || took > queuedFor+4*stallAfter {
			t.Errorf("a request the peer hangs while answering another was left after %s, want after queuedFor (%s)", took, queuedFor)
		}
	})
}
