package blobstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
)

// A directory Open never made a store of is never deleted, whatever it holds.
func TestRemoveLeavesADirectoryThatIsNotAStore(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "blobs", "sha256"), 0o755)
	keep := filepath.Join(root, "blobs", "sha256", digest.FromString("x").Encoded())
	os.WriteFile(keep, []byte("x"), 0o644)
	os.WriteFile(filepath.Join(root, "state.json"), []byte("{}"), 0o600)
	if err := Remove(root); !errors.Is(err, ErrNotAStore) {
		t.Fatalf("Remove of an unmarked directory: %v, want ErrNotAStore", err)
	}
	for _, f := range []string{keep, filepath.Join(root, "state.json")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s was deleted: %v", f, err)
		}
	}
	if err := Remove(filepath.Join(root, "missing")); err != nil {
		t.Errorf("Remove of a missing directory: %v", err)
	}
}

// Remove deletes what the store keeps (blobs, ingests, marker) and nothing else: a
// store_dir pointed at a directory that holds other files keeps them.
func TestRemoveDeletesOnlyWhatTheStoreHolds(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	root := filepath.Join(parent, "data")
	os.MkdirAll(root, 0o755)
	other := filepath.Join(root, "admin-notes.txt")
	os.WriteFile(other, []byte("mine"), 0o600)
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("a blob")
	d := digest.FromBytes(data)
	w, err := s.Writer(ctx, d, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data)
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// An ingest a killed process left.
	half := digest.FromString("half")
	w2, _ := s.Writer(ctx, half, -1)
	w2.Write([]byte("ha"))
	w2.w.Close()
	if _, err := os.Stat(filepath.Join(root, markerName)); err != nil {
		t.Fatalf("Open wrote no marker: %v", err)
	}

	if err := Remove(root); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"blobs", "ingest", markerName} {
		if _, err := os.Stat(filepath.Join(root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after Remove (%v)", gone, err)
		}
	}
	if b, err := os.ReadFile(other); err != nil || string(b) != "mine" {
		t.Errorf("the administrator's file: %q, %v", b, err)
	}

	// A store alone in its directory takes the directory with it.
	root2 := filepath.Join(parent, "store")
	if _, err := Open(root2); err != nil {
		t.Fatal(err)
	}
	if err := Remove(root2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an emptied store's directory stays: %v", err)
	}
}
