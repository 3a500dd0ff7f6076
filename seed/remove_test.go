package seed

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// Removing a seed takes its record and the blobs no other seed and no pin needs.
func TestRemoveKeepsWhatOthersNeed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, Deps{})
	a := writeOCI(t, 20)
	b := writeOCI(t, 20) // the same images...
	editName(t, b, "quay.io/ns/app:v1", "quay.io/ns/other:v1")
	sa, err := e.seeder.Seed(ctx, a.dir)
	must(t, err)
	sb, err := e.seeder.Seed(ctx, b.dir)
	must(t, err)
	if sa.ID == sb.ID || sb.Written != 0 {
		t.Fatalf("two seeds of the same content: %s %s, wrote %d", sa.ID, sb.ID, sb.Written)
	}
	// b goes: a needs all of it.
	r, err := e.seeder.Remove(ctx, b.dir, nil)
	if err != nil || r.ID != sb.ID || r.Blobs != 0 {
		t.Fatalf("remove by path: %+v %v", r, err)
	}
	all := len(e.blobs(t))
	// a goes, by an id prefix, with the index pinned: the index and what it names stay.
	id, _ := a.index.Digest()
	pinned := []string{"registry.example.com/team/multi@" + id.String(), "quay.io/*"}
	r, err = e.seeder.Remove(ctx, sa.ID[:8], pinned)
	if err != nil {
		t.Fatal(err)
	}
	kept := contentOf(t, a.index)
	if left := e.blobs(t); len(left) != len(kept) || r.Blobs != all-len(kept) {
		t.Fatalf("left %d blobs (removed %d), want the pinned index's %d", len(left), r.Blobs, len(kept))
	}
	wantAll(t, e, kept)
	if recs := e.records(t); len(recs) != 0 {
		t.Fatalf("records left: %v", recs)
	}
	if _, err := e.seeder.Remove(ctx, sa.ID, nil); !errors.Is(err, ErrNoSeed) {
		t.Fatalf("removing it again: %v", err)
	}
}

func editName(t *testing.T, o *ociMedia, from, to string) {
	t.Helper()
	p := filepath.Join(o.dir, "index.json")
	raw, err := readFile(p)
	must(t, err)
	must(t, writeFile(p, strings.Replace(raw, from, to, 1)))
}
