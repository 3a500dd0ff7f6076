package peers

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// corruptWatch counts the blob requests each node's peer server takes, and the blob
// requests the joiner sent each peer after it had set the peer aside as sending wrong
// bytes.
type corruptWatch struct {
	mu    sync.Mutex
	total map[int]int
	// after counts, by peer, the blob requests the joiner sent it after setting it
	// aside as sending wrong bytes.
	after map[string]int
}

func (w *corruptWatch) wrap(i int, h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") {
			w.mu.Lock()
			w.total[i]++
			w.mu.Unlock()
		}
		h.ServeHTTP(rw, r)
	})
}

// watchSends counts, where src sends them, its blob requests to a peer it has set aside
// as sending wrong bytes (longer than failedFor). Counted where the joiner sends, not
// where the peer takes them: a peer's server may hold a request sent before its first
// cut until a serving slot is free.
func (w *corruptWatch) watchSends(src *Source) {
	next := src.Client.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	src.Client.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.Contains(r.URL.Path, "/blobs/") {
			if left := src.asideFor(r.URL.Host); left > failedFor {
				w.mu.Lock()
				w.after[r.URL.Host]++
				w.mu.Unlock()
			}
		}
		return next.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// pullWith is what a runtime does: every blob through nd's local mirror, workers at
// once, each blob tried again (up to tries) when its transfer fails. It says how
// many transfers failed.
func (c *cluster) pullWith(nd *node, workers, tries int) (int, error) {
	md := digest.FromBytes(c.reg.manifest)
	get := func(kind string, d digest.Digest) error {
		resp, err := http.Get(nd.local.URL + "/v2/" + repo + "/" + kind + "/" + d.String())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("%s %s: %w", kind, d, err)
		}
		if resp.StatusCode != http.StatusOK || digest.FromBytes(b) != d {
			return fmt.Errorf("%s %s: status %d, %d bytes that do not match", kind, d, resp.StatusCode, len(b))
		}
		return nil
	}
	if err := get("manifests", md); err != nil {
		return 0, err
	}
	todo := make(chan digest.Digest, len(c.reg.blobs))
	for d := range c.reg.blobs {
		todo <- d
	}
	close(todo)
	var mu sync.Mutex
	var failed int
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range todo {
				var err error
				for range tries {
					if err = get("blobs", d); err == nil {
						break
					}
					mu.Lock()
					failed++
					mu.Unlock()
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return failed, errs[0]
	}
	return failed, nil
}

// corruptStore flips a byte in the middle of every blob nd's store holds.
func (c *cluster) corruptStore(i int) {
	c.t.Helper()
	dir := filepath.Join(c.dir, fmt.Sprintf("node-%d", i), "blobs", "sha256")
	entries, err := os.ReadDir(dir)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			c.t.Fatal(err)
		}
		if len(data) < 1024 {
			continue // the config: left whole
		}
		data[len(data)/2] ^= 0xff
		if err := os.WriteFile(path, data, 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
}

// joinPast starts 4 nodes, has nodes 1 to 3 pull the image, corrupts the stores of
// those in corrupted, and times node 0 pulling it as a runtime does.
func joinPast(t *testing.T, corrupted ...int) (*cluster, *corruptWatch, time.Duration, int, error) {
	reg := newRegistry(t, 24, 512<<10)
	reg.delay = 2 * time.Millisecond
	w := &corruptWatch{after: map[string]int{}, total: map[int]int{}}
	c := newClusterOpts(t, reg, 4, clusterOpts{wrap: w.wrap, noHolders: true})
	w.watchSends(c.nodes[0].src)
	for _, nd := range c.nodes[1:] {
		if err := c.pull(nd); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range corrupted {
		c.corruptStore(i)
	}
	w.mu.Lock()
	clear(w.total)
	w.mu.Unlock()
	start := time.Now()
	failed, err := c.pullWith(c.nodes[0], 4, 5)
	return c, w, time.Since(start), failed, err
}

// A node joining past three peers, two of whose stores are corrupted on disk: a
// corrupted peer is found out at its first blob (it stops within the bytes it holds
// back until its copy matches) and set aside for every blob at once, as a peer sending
// wrong bytes: asked for nothing more, and the transfers from it under way move on to
// the next node. The healthy peer is never taken for the culprit. The join is timed
// against the same join past healthy peers.
func TestAJoinPastCorruptedPeersSetsThemAsideForEveryBlob(t *testing.T) {
	_, _, healthy, _, err := joinPast(t)
	if err != nil {
		t.Fatalf("the join past healthy peers: %v", err)
	}
	c, w, took, failed, err := joinPast(t, 2, 3)
	joiner := c.nodes[0]
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("joined past 2 corrupted peers in %s, past healthy ones in %s (%.2f×): %d transfers failed; blob requests to the corrupted peers %d and %d, sent after they were found out %d and %d",
		took.Round(time.Millisecond), healthy.Round(time.Millisecond), took.Seconds()/healthy.Seconds(), failed, w.total[2], w.total[3], w.after[c.nodes[2].addr], w.after[c.nodes[3].addr])
	if err != nil {
		t.Fatalf("the join: %v", err)
	}
	// A corrupted peer whose answer the joiner had read into is set aside as one
	// sending wrong bytes; one that cut its answer before the joiner saw it (the
	// machine busy) is set aside as any failing peer, asked once more for a blob
	// before the registry if it heads the blob's tree, and the blob comes whole from
	// the next.
	var wrong int
	for _, i := range []int{2, 3} {
		addr := c.nodes[i].addr
		// A worker may have chosen the peer for its next blob just before another
		// found it out: at most one request a worker, then none.
		if n := w.after[addr]; n > 4 {
			t.Errorf("peer %d was asked for %d blobs after it was set aside as sending wrong bytes, want at most the 4 chosen before", i, n)
		}
		aside := joiner.src.asideFor(addr)
		if aside <= 0 {
			t.Errorf("corrupted peer %d is not set aside", i)
		}
		if aside > failedFor {
			wrong++
		}
	}
	if wrong == 0 {
		t.Errorf("neither corrupted peer is set aside as sending wrong bytes (%s and %s, want %s)",
			joiner.src.asideFor(c.nodes[2].addr).Round(time.Second), joiner.src.asideFor(c.nodes[3].addr).Round(time.Second), corruptFor)
	}
	if joiner.src.isAside(c.nodes[1].addr) {
		t.Errorf("the healthy peer was set aside for %s", joiner.src.asideFor(c.nodes[1].addr).Round(time.Second))
	}
	// A transfer fails when bytes of a corrupted copy reached it before the peer was
	// found out: at most the 4 in flight (one a worker) when each corrupted peer was
	// found out, and the two are found out at moments of their own (a worker whose
	// transfer the first cut may have moved to the second). Without the set-aside,
	// every blob a corrupted peer heads would fail (two thirds of 24).
	if most := 4 * 2; failed > most {
		t.Errorf("%d transfers failed past 2 corrupted peers, want at most the %d in flight when each was found out", failed, most)
	}
}
