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

// corruptWatch counts the blob requests each node's peer server takes, and when each
// first cut a blob (its stored copy found not to match while it served it).
type corruptWatch struct {
	mu       sync.Mutex
	firstCut map[int]time.Time
	// after counts the blob requests node i took after its first cut (plus grace:
	// the asker has seen the cut by then).
	after map[int]int
	total map[int]int
}

const cutGrace = 200 * time.Millisecond

func (w *corruptWatch) wrap(i int, h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.URL.Path, "/blobs/") {
			h.ServeHTTP(rw, r)
			return
		}
		w.mu.Lock()
		w.total[i]++
		if cut, ok := w.firstCut[i]; ok && time.Since(cut) > cutGrace {
			w.after[i]++
		}
		w.mu.Unlock()
		defer func() {
			if p := recover(); p != nil {
				w.mu.Lock()
				if _, ok := w.firstCut[i]; !ok {
					w.firstCut[i] = time.Now()
				}
				w.mu.Unlock()
				panic(p)
			}
		}()
		h.ServeHTTP(rw, r)
	})
}

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
	w := &corruptWatch{firstCut: map[int]time.Time{}, after: map[int]int{}, total: map[int]int{}}
	c := newClusterOpts(t, reg, 4, clusterOpts{wrap: w.wrap, noHolders: true})
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
	t.Logf("joined past 2 corrupted peers in %s, past healthy ones in %s (%.2f×): %d transfers failed; blob requests to the corrupted peers %d and %d, after their first cut %d and %d",
		took.Round(time.Millisecond), healthy.Round(time.Millisecond), took.Seconds()/healthy.Seconds(), failed, w.total[2], w.total[3], w.after[2], w.after[3])
	if err != nil {
		t.Fatalf("the join: %v", err)
	}
	// A corrupted peer whose answer the joiner had read into is set aside as one
	// sending wrong bytes; one that cut its answer before the joiner saw it (the
	// machine busy) is left as any failing peer, and the blob came whole from the next.
	var wrong int
	for _, i := range []int{2, 3} {
		if w.after[i] > 0 {
			t.Errorf("peer %d was asked for %d blobs after it cut one for not matching", i, w.after[i])
		}
		aside := joiner.src.asideFor(c.nodes[i].addr)
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
	// found out: at most those in flight then, one a worker.
	if failed > 4 {
		t.Errorf("%d transfers failed past 2 corrupted peers, want at most the %d in flight", failed, 4)
	}
}
