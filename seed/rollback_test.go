package seed

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/blobstore"
)

// fillingStore is the store with imagepind filling one blob (its mirror, for a pinned
// image) after the seed planned and before it writes that blob.
type fillingStore struct {
	*blobstore.Store
	fill digest.Digest
	data []byte
}

func (s *fillingStore) ResumeWriter(ctx context.Context, prefix string, d digest.Digest, size int64) (*blobstore.Writer, int64, error) {
	if d == s.fill {
		w, err := s.Store.Writer(context.Background(), d, int64(len(s.data)))
		if err != nil {
			return nil, 0, err
		}
		if _, err := w.Write(s.data); err != nil {
			return nil, 0, err
		}
		if err := w.Commit(context.Background()); err != nil {
			return nil, 0, err
		}
		w.Close()
	}
	return s.Store.ResumeWriter(ctx, prefix, d, size)
}

// A seed of a bad medium deletes what it wrote, and only that: a blob imagepind
// committed meanwhile (the store says ErrExists to the seed) stays.
func TestRollbackKeepsWhatTheSeedDidNotWrite(t *testing.T) {
	o := writeOCI(t, 22)
	config, _ := o.named.ConfigName()
	data, err := os.ReadFile(filepath.Join(o.dir, "blobs", "sha256", config.Hex))
	must(t, err)
	ls, _ := o.named.Layers()
	ld, _ := ls[len(ls)-1].Digest()
	layer := filepath.Join(o.dir, "blobs", "sha256", ld.Hex)
	b, err := os.ReadFile(layer)
	must(t, err)
	b[len(b)/2] ^= 0xff
	must(t, os.WriteFile(layer, b, 0o644))

	e := newEnv(t, Deps{})
	fill := digest.Digest(config.String())
	e.seeder.deps.Store = &fillingStore{Store: e.store, fill: fill, data: data}
	_, err = e.seeder.Seed(context.Background(), o.dir)
	if !errors.Is(err, ErrBadMedia) {
		t.Fatalf("got %v, want the bad layer refused", err)
	}
	rd, _, err := e.store.Reader(context.Background(), fill)
	if err != nil {
		t.Fatalf("the blob imagepind stored meanwhile is gone after the rollback: %v", err)
	}
	got, _ := io.ReadAll(rd)
	rd.Close()
	if digest.FromBytes(got) != fill {
		t.Fatal("the blob imagepind stored meanwhile has other bytes")
	}
	if len(e.records(t)) != 0 {
		t.Fatalf("recorded %v", e.records(t))
	}
	for _, d := range e.blobs(t) {
		if d != fill {
			t.Errorf("the rollback left %s, which the seed wrote", d)
		}
	}
}
