package peers

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/seed"
)

// The prune keeps what a seed record names (complete or pending) though nothing pins
// it, and prunes nothing while a record cannot be read.
func TestPruneKeepsSeededBlobs(t *testing.T) {
	ctx := context.Background()
	seeds := filepath.Join(t.TempDir(), "seeds")
	n := newNode(t, Config{SeedsDir: seeds})
	put := func() digest.Digest {
		b := make([]byte, 1000)
		rand.Read(b)
		d := digest.FromBytes(b)
		w, err := n.store.Writer(ctx, d, int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
		if err := w.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		w.Close()
		return d
	}
	seeded, pending, loose := put(), put(), put()
	os.MkdirAll(seeds, 0o700)
	write := func(name string, r seed.Record) {
		b, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(seeds, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("aaaaaaaaaaaaaaaa.json", seed.Record{Version: seed.RecordVersion, ID: "aaaaaaaaaaaaaaaa", Complete: true,
		Blobs: []seed.Content{{Digest: seeded, Size: 1000}}})
	write("bbbbbbbbbbbbbbbb.pending.json", seed.Record{Version: seed.RecordVersion, ID: "bbbbbbbbbbbbbbbb",
		Manifests: []seed.Content{{Digest: pending, Size: 1000}}})
	os.WriteFile(filepath.Join(seeds, "cccccccccccccccc.json"), []byte("{"), 0o600)
	n.pruneOnce(ctx)
	for _, d := range []digest.Digest{seeded, pending, loose} {
		if _, ok := n.store.Size(ctx, d); !ok {
			t.Fatalf("%s pruned while a seed record could not be read", d)
		}
	}
	os.Remove(filepath.Join(seeds, "cccccccccccccccc.json"))
	n.pruneOnce(ctx)
	for d, want := range map[digest.Digest]bool{seeded: true, pending: true, loose: false} {
		if _, ok := n.store.Size(ctx, d); ok != want {
			t.Fatalf("%s kept: %v, want %v", d, ok, want)
		}
	}
}
