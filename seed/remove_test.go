package seed

import (
	"context"
	"errors"
	"os"
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

// A medium taken away (the seed directory): a seed with another medium left keeps its
// record and content, one left with none is removed with what nothing else needs.
func TestForgetAMedium(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, Deps{})
	a := writeOCI(t, 50)
	copyOf := filepath.Join(t.TempDir(), "copy")
	must(t, os.CopyFS(copyOf, os.DirFS(a.dir)))
	sa, err := e.seeder.Seed(ctx, a.dir)
	must(t, err)
	if _, err := e.seeder.Seed(ctx, copyOf); err != nil {
		t.Fatal(err)
	}
	all := len(e.blobs(t))
	// The copy goes: the seed stays, from a alone.
	if rm, err := e.seeder.Forget(ctx, copyOf, nil, ""); err != nil || len(rm) != 0 {
		t.Fatalf("forget one of two media: %v %v", rm, err)
	}
	recs, err := Records(e.dir)
	must(t, err)
	if len(recs) != 1 || len(recs[0].Media) != 1 || recs[0].Media[0].Path != a.dir || len(e.blobs(t)) != all {
		t.Fatalf("after one medium of two: %d records, media %+v, %d blobs of %d", len(recs), recs[0].Media, len(e.blobs(t)), all)
	}
	// a goes too: so does the seed, and its content.
	rm, err := e.seeder.Forget(ctx, a.dir, nil, "")
	if err != nil || len(rm) != 1 || rm[0].ID != sa.ID || rm[0].Blobs != all {
		t.Fatalf("forget the last medium: %+v %v", rm, err)
	}
	if recs := e.records(t); len(recs) != 0 || len(e.blobs(t)) != 0 {
		t.Fatalf("left %d records, %d blobs", len(recs), len(e.blobs(t)))
	}
	if _, err := e.seeder.Forget(ctx, a.dir, nil, ""); !errors.Is(err, ErrNoSeed) {
		t.Fatalf("a medium no record names: %v", err)
	}
	// A medium replaced at its path by another: the new seed stays, the old goes.
	sa, err = e.seeder.Seed(ctx, a.dir)
	must(t, err)
	b := writeOCI(t, 51)
	must(t, os.RemoveAll(a.dir))
	must(t, os.Rename(b.dir, a.dir))
	sb, err := e.seeder.Seed(ctx, a.dir)
	must(t, err)
	rm, err = e.seeder.Forget(ctx, a.dir, nil, sb.ID)
	if err != nil || len(rm) != 1 || rm[0].ID != sa.ID {
		t.Fatalf("forget the replaced medium's old seed: %+v %v", rm, err)
	}
	if recs, _ := Records(e.dir); len(recs) != 1 || recs[0].ID != sb.ID {
		t.Fatalf("after the old seed went: %d records", len(recs))
	}
}
