package peers

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/seed"
)

// What the node holds of a pinned image is read again after each keeper pass, off the
// agent's loop: uncertain (a why) while its manifest is not in the store, every blob
// held once the keeper stored them, the agent woken when that changed, and the held
// summary its peers read names every blob kept.
func TestAKeepPassIsToldToTheAgentAndThePeers(t *testing.T) {
	fastKeep(t)
	old := holdingsEvery
	holdingsEvery = time.Hour // only a keeper pass, or a change of the pins, reads them
	t.Cleanup(func() { holdingsEvery = old })
	reg := newRegistry(t, 3, 64<<10)
	reg.down.Store(true)
	md := digest.FromBytes(reg.manifest)
	ref := repo + "@" + md.String()
	n := newNode(t, Config{})
	n.Bind(Runtime{Registry: reg})
	var pokes atomic.Int32
	n.OnHoldings(func() { pokes.Add(1) })
	if blobs, why := n.ImageBlobs(ref); blobs != nil || why != "the node's store has not been read yet" {
		t.Fatalf("before Run: %v %q", blobs, why)
	}
	run(t, n.Run)
	n.setPinned([]string{ref})

	wait := func(what string, ok func() bool) {
		t.Helper()
		for i := 0; !ok(); i++ {
			if i == 1000 {
				blobs, why := n.ImageBlobs(ref)
				t.Fatalf("not %s within 10 s: %+v %q", what, blobs, why)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait("uncertain, its manifest not held", func() bool {
		_, why := n.ImageBlobs(ref)
		return why == "a manifest of it is not in the node's store yet, so not all its blobs are known"
	})
	// The manifest, not held, has no size the node knows: 0, never the mirror's -1, which
	// the aggregator refuses (the whole report with it, and with that the node's peers).
	if blobs, _ := n.ImageBlobs(ref); len(blobs) != 1 || blobs[0].Digest != md.String() || blobs[0].Size != 0 || blobs[0].Held {
		t.Fatalf("the manifest not held yet: %+v; want it alone, not held, size 0", blobs)
	}
	before := pokes.Load()
	if before == 0 {
		t.Fatal("the agent was not woken by the first reading")
	}

	reg.down.Store(false)
	wait("every blob held", func() bool {
		blobs, why := n.ImageBlobs(ref)
		if why != "" || len(blobs) != 1+len(reg.blobs) {
			return false
		}
		for _, b := range blobs {
			if !b.Held {
				return false
			}
		}
		return true
	})
	if pokes.Load() == before {
		t.Fatal("the agent was not woken when the keeper had stored the blobs")
	}

	h := &heldServer{pinned: n.heldDigests}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, HeldPath, nil))
	var sum heldSummary
	if err := json.Unmarshal(w.Body.Bytes(), &sum); err != nil {
		t.Fatal(err)
	}
	got := newDigestSet(sum.Digests)
	for d := range reg.blobs {
		if !got.contains(d) {
			t.Fatalf("the held summary %v does not name the kept blob %s", sum.Digests, d)
		}
	}
	if !got.contains(md) || len(got) != 1+len(reg.blobs) {
		t.Fatalf("the held summary %v; want the manifest and the %d blobs", sum.Digests, len(reg.blobs))
	}

	n.setPinned(nil)
	wait("gone with its pin", func() bool {
		_, why := n.ImageBlobs(ref)
		return why == "the node's mirror does not pin it yet"
	})
}

// A blob of a pinned image that a complete seed on the node holds is Seeded in what the
// agent is told (so the aggregator counts the seed's medium as one more holder); one
// that only a pending seed names, or no seed, is not; a seed removed takes it back.
func TestASeededBlobIsToldSeeded(t *testing.T) {
	fastKeep(t)
	old := holdingsEvery
	holdingsEvery = 20 * time.Millisecond
	t.Cleanup(func() { holdingsEvery = old })
	reg := newRegistry(t, 3, 64<<10)
	md := digest.FromBytes(reg.manifest)
	ref := repo + "@" + md.String()
	seeds := filepath.Join(t.TempDir(), "seeds")
	n := newNode(t, Config{SeedsDir: seeds})
	n.Bind(Runtime{Registry: reg})
	run(t, n.Run)
	n.setPinned([]string{ref})

	var layers []digest.Digest
	for d := range reg.blobs {
		layers = append(layers, d)
	}
	slices.Sort(layers)
	os.MkdirAll(seeds, 0o700)
	write := func(name string, r seed.Record) {
		b, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(seeds, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("aaaaaaaaaaaaaaaa.json", seed.Record{Version: seed.RecordVersion, ID: "aaaaaaaaaaaaaaaa", Complete: true,
		Manifests: []seed.Content{{Digest: md, Size: int64(len(reg.manifest))}},
		Blobs:     []seed.Content{{Digest: layers[0], Size: int64(len(reg.blobs[layers[0]]))}}})
	write("bbbbbbbbbbbbbbbb.pending.json", seed.Record{Version: seed.RecordVersion, ID: "bbbbbbbbbbbbbbbb",
		Blobs: []seed.Content{{Digest: layers[1], Size: int64(len(reg.blobs[layers[1]]))}}})

	seededOf := func() (map[string]bool, bool) {
		blobs, why := n.ImageBlobs(ref)
		if why != "" || len(blobs) != 1+len(reg.blobs) {
			return nil, false
		}
		got := map[string]bool{}
		for _, b := range blobs {
			if !b.Held {
				return nil, false
			}
			got[b.Digest] = b.Seeded
		}
		return got, true
	}
	wait := func(what string, ok func(map[string]bool) bool) {
		t.Helper()
		for i := 0; ; i++ {
			if got, read := seededOf(); read && ok(got) {
				return
			}
			if i == 1000 {
				blobs, why := n.ImageBlobs(ref)
				t.Fatalf("not %s within 10 s: %+v %q", what, blobs, why)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait("the complete seed's manifest and blob Seeded, nothing else", func(got map[string]bool) bool {
		for d, s := range got {
			if s != (d == md.String() || d == layers[0].String()) {
				return false
			}
		}
		return true
	})
	os.Remove(filepath.Join(seeds, "aaaaaaaaaaaaaaaa.json"))
	wait("nothing Seeded once the seed is removed", func(got map[string]bool) bool {
		for _, s := range got {
			if s {
				return false
			}
		}
		return true
	})
}
