package peers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// busyHolder is what a peer (node 1) does that lists every digest of reg in its
// summary (HeldPath) and answers every other request 503, for ever; asked counts those.
func busyHolder(reg *fakeRegistry, asked *atomic.Int64) func(int, http.Handler) http.Handler {
	all := []digest.Digest{digest.FromBytes(reg.manifest)}
	for d := range reg.blobs {
		all = append(all, d)
	}
	slices.Sort(all)
	return func(i int, h http.Handler) http.Handler {
		if i != 1 {
			return h
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == HeldPath {
				json.NewEncoder(w).Encode(heldSummary{Digests: all})
				return
			}
			asked.Add(1)
			http.Error(w, "busy", http.StatusServiceUnavailable)
		})
	}
}

// A peer whose summary lists every digest and that answers 503 for ever costs the first
// fetch its busy window (busyWait), and is set aside: the fetches after it skip it
// until its time is up, and none of them waits on it again, with the registry there
// (they read the registry, and ask it nothing) or gone (they fail at once, the
// set-aside holder asked once each, for what it holds only).
func TestABusyHolderSetAsideIsSkipped(t *testing.T) {
	busyPeers(t)
	busyWait = time.Second
	for _, gone := range []bool{false, true} {
		name := "TheRegistryThere"
		if gone {
			name = "TheRegistryGone"
		}
		t.Run(name, func(t *testing.T) {
			reg := newRegistry(t, 3, 16<<10)
			var asked atomic.Int64
			c := newClusterOpts(t, reg, 2, clusterOpts{wrapServer: busyHolder(reg, &asked)})
			reader, busy := c.nodes[0], c.nodes[1]
			md := digest.FromBytes(reg.manifest)
			// The summary first, as any node has it after its first fetch.
			deadline := time.Now().Add(time.Minute)
			for len(reader.src.held.of(context.Background(), c.addrs(), md)) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no summary from the busy holder after a minute")
				}
				time.Sleep(heldRetry)
			}
			reg.down.Store(gone)
			// The first fetch finds the holder busy for its whole window.
			if _, _, err := reader.src.Manifest(context.Background(), repo, nil, md, -1); gone == (err == nil) {
				t.Fatalf("the first manifest: %v with the registry gone: %t", err, gone)
			}
			if !reader.src.isAside(busy.addr) {
				t.Fatal("a holder busy for a whole window was not set aside")
			}
			fetch := func(what string, f func() error) {
				t.Helper()
				before := asked.Load()
				start := time.Now()
				err := f()
				took := time.Since(start)
				want := int64(0)
				if gone {
					want = 1
				}
				if n := asked.Load() - before; n != want {
					t.Errorf("%s: the set-aside holder was asked %d times, want %d", what, n, want)
				}
				t.Logf("%s: %s, %v", what, took.Round(time.Millisecond), err)
				if gone == (err == nil) {
					t.Errorf("%s: %v with the registry gone: %t", what, err, gone)
				}
				if took >= busyWait/2 {
					t.Errorf("%s took %s: the set-aside holder was waited on (busyWait %s)", what, took.Round(time.Millisecond), busyWait)
				}
			}
			for i := range 3 {
				fetch("manifest "+string(rune('1'+i)), func() error {
					data, _, err := reader.src.Manifest(context.Background(), repo, nil, md, -1)
					if err == nil && !bytes.Equal(data, reg.manifest) {
						t.Errorf("the manifest: %d bytes that are not it", len(data))
					}
					return err
				})
			}
			for d, want := range reg.blobs {
				fetch("blob "+d.Encoded()[:8], func() error {
					rc, _, err := reader.src.Blob(context.Background(), repo, []digest.Digest{md}, d, int64(len(want)))
					if err != nil {
						return err
					}
					defer rc.Close()
					b, err := io.ReadAll(rc)
					if err == nil && !bytes.Equal(b, want) {
						t.Errorf("blob %s: %d bytes that are not it", d, len(b))
					}
					return err
				})
			}
		})
	}
}

// A fetch waiting on a busy holder stops waiting once another fetch, which found it
// busy for its whole window, sets it aside: it does not wait out a window of its own.
func TestAFetchWaitingOnABusyHolderStopsWhenItIsSetAside(t *testing.T) {
	busyPeers(t)
	busyWait = 2 * time.Second
	reg := newRegistry(t, 1, 16<<10)
	var asked atomic.Int64
	c := newClusterOpts(t, reg, 2, clusterOpts{wrapServer: busyHolder(reg, &asked)})
	reader, busy := c.nodes[0], c.nodes[1]
	md := digest.FromBytes(reg.manifest)
	deadline := time.Now().Add(time.Minute)
	for len(reader.src.held.of(context.Background(), c.addrs(), md)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no summary from the busy holder after a minute")
		}
		time.Sleep(heldRetry)
	}
	first := make(chan error, 1)
	go func() {
		_, _, err := reader.src.Manifest(context.Background(), repo, nil, md, -1)
		first <- err
	}()
	time.Sleep(busyWait / 2)
	start := time.Now()
	if _, _, err := reader.src.Manifest(context.Background(), repo, nil, md, -1); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	t.Logf("the manifest asked again half a window after the first: %s (busyWait %s)", took.Round(time.Millisecond), busyWait)
	if !reader.src.isAside(busy.addr) {
		t.Fatal("a holder busy for a whole window was not set aside")
	}
	if took > busyWait*4/5 {
		t.Fatalf("the second fetch took %s: it waited out its own busy window after the holder was set aside", took.Round(time.Millisecond))
	}
}
