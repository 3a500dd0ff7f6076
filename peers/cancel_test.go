package peers

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// summariesAsked is how many peers' summaries nd asked for.
func (nd *node) summariesAsked() int {
	nd.src.held.mu.Lock()
	defer nd.src.held.mu.Unlock()
	return nd.src.held.fetches
}

// A manifest's fetch that nobody waits for any more (the pull, or the peer's request it
// served, ended: the mirror's shared fetch ends with its last waiter) stops: it asks no
// further node, not the registry, and fetches no peer's summary at the registry's turn.
// It walked on, failing at every node left in the order at once, and at its own turn
// asked every peer for its summary in the background: at N = 200 with the links 4×
// slower the nodes made 134,976 manifest requests, 130,995 of them failing, and most of
// their 80,210 connections to peers were for summaries.
func TestAFetchNobodyWaitsForStops(t *testing.T) {
	const n = 6
	reg := newRegistry(t, 1, 1<<10)
	md := digest.FromBytes(reg.manifest)
	arrived := make(chan struct{}, 1)
	var head string
	c := newClusterWith(t, reg, n, func(i int, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/manifests/") {
				// The head of the manifest's order works on it for as long as it is
				// waited for (its registry is slow).
				select {
				case arrived <- struct{}{}:
				default:
				}
				<-r.Context().Done()
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	order := Order(md, c.addrs())
	head = order[0]
	last := c.nodes[c.index(order[n-1])]

	t.Run("manifest", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, _, err := last.src.Manifest(ctx, repo, nil, md, -1)
			done <- err
		}()
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatalf("the head %s was never asked for the manifest", head)
		}
		cancel()
		var err error
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the fetch did not end when nobody waited for it any more")
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the fetch ended with %v, want context.Canceled", err)
		}
		time.Sleep(100 * time.Millisecond) // any summary fetch started would be counted by now
		if got := reg.attempts.Load(); got != 0 {
			t.Errorf("the registry was asked %d times by a fetch nobody waited for, want none", got)
		}
		if got := last.summariesAsked(); got != 0 {
			t.Errorf("a fetch nobody waited for asked %d peers for their summaries, want none", got)
		}
	})

	t.Run("blob", func(t *testing.T) {
		var d digest.Digest
		for b := range reg.blobs {
			d = b
		}
		bhead := c.nodes[c.index(Order(d, c.addrs())[0])]
		before := bhead.summariesAsked()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if rc, _, err := bhead.src.Blob(ctx, repo, []digest.Digest{md}, d, int64(len(reg.blobs[d]))); err == nil {
			rc.Close() // the fake registry reads no context
		}
		time.Sleep(100 * time.Millisecond)
		if got := bhead.summariesAsked() - before; got != 0 {
			t.Errorf("the head of a blob's tree asked %d peers for their summaries for a request already ended, want none", got)
		}
	})
}
