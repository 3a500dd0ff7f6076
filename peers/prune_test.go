package peers

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
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

// A node restarted after a kill -9 releases the ingests the killed process left, at
// once, though it pins nothing (no pin write ever wakes its prune): they do not stay
// until its first pin.
func TestRunReleasesIngestsLeftByAKillAtStart(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "blobs")
	killed, err := blobstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1000)
	rand.Read(b)
	d := digest.FromBytes(b)
	w, err := killed.Writer(ctx, d, -1)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(b[:600]) // never committed nor closed: "kill -9"
	store, err := blobstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := New(Config{}, store, logrus.New())
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Run(runCtx) }()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.Stat(store.IngestFile(d))
		if os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed fill's ingest is still there %s after the start: %v", 5*time.Second, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
