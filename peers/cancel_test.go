package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
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

// A node fetches at most heldAtOnce summaries at once, whatever the number of peers it
// wants them of: a head of a digest wanting forty peers' summaries makes eight TLS
// connections at a time, not forty, and gets every one of them in the end.
func TestSummariesAreFetchedAFewAtATime(t *testing.T) {
	const peers = 40
	var inFlight, most, asked atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		asked.Add(1)
		time.Sleep(20 * time.Millisecond)
		json.NewEncoder(w).Encode(heldSummary{Digests: []digest.Digest{}})
	}))
	defer srv.Close()
	// Every peer's address reaches the one server, each on its own connection.
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.InsecureSkipVerify = true
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String())
	}
	defer tr.CloseIdleConnections()
	h := newHoldings(&http.Client{Transport: tr}, logrus.New())
	var nodes []string
	for i := range peers {
		nodes = append(nodes, fmt.Sprintf("node-%d.example:443", i))
	}
	h.of(context.Background(), nodes, digest.FromString("x"))
	for end := time.Now().Add(30 * time.Second); asked.Load() < peers && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := asked.Load(); got != peers {
		t.Errorf("%d of %d peers' summaries were fetched, want every one", got, peers)
	}
	if got := most.Load(); got > int64(heldAtOnce) {
		t.Errorf("%d summaries fetched at once, want at most %d", got, heldAtOnce)
	}
}
