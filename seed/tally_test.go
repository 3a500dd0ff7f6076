package seed

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// The node's status sums its complete seeds, counting what two seeds share once; an
// unreadable record is an error.
func TestTally(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, Deps{})
	if got, err := Tally(e.dir); err != nil || got != (Totals{}) {
		t.Fatalf("no seeds: %+v %v", got, err)
	}
	a := writeOCI(t, 30)
	b := writeOCI(t, 30)
	editName(t, b, "quay.io/ns/app:v1", "quay.io/ns/other:v1") // the same content, one name more
	sa, err := e.seeder.Seed(ctx, a.dir)
	must(t, err)
	_, err = e.seeder.Seed(ctx, b.dir)
	must(t, err)
	got, err := Tally(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Totals{Seeds: 2, Images: 4, Bytes: sa.Bytes}); got != want {
		t.Fatalf("tally %+v, want %+v", got, want)
	}
	must(t, os.WriteFile(filepath.Join(e.dir, "0123456789abcdef.json"), []byte("{"), 0o600))
	if _, err := Tally(e.dir); err == nil {
		t.Fatal("an unreadable record: no error")
	}
}

// What a node tells its peers it holds: every manifest and blob of its complete seeds,
// each once; nothing of a seed still pending.
func TestHeld(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, Deps{})
	if got, err := Held(e.dir); err != nil || len(got) != 0 {
		t.Fatalf("no seeds: %v %v", got, err)
	}
	a := writeOCI(t, 40)
	b := writeOCI(t, 40)
	editName(t, b, "quay.io/ns/app:v1", "quay.io/ns/other:v1")
	_, err := e.seeder.Seed(ctx, a.dir)
	must(t, err)
	_, err = e.seeder.Seed(ctx, b.dir)
	must(t, err)
	recs, err := Records(e.dir)
	must(t, err)
	want := map[string]bool{}
	for _, r := range recs {
		for _, c := range append(slices.Clone(r.Manifests), r.Blobs...) {
			want[c.Digest.String()] = true
		}
	}
	got, err := Held(e.dir)
	must(t, err)
	if len(got) != len(want) {
		t.Fatalf("held %d digests, want %d (each once)", len(got), len(want))
	}
	for _, d := range got {
		if !want[d.String()] {
			t.Fatalf("held %s, which no seed names", d)
		}
	}
	// A pending record (a seed cut short) is not held yet.
	pending := *recs[0]
	pending.ID, pending.Complete = "0123456789abcdef", false
	pending.Blobs = append(slices.Clone(pending.Blobs), Content{Digest: digest.Digest("sha256:" + strings.Repeat("ab", 32)), Size: 1})
	must(t, writeRecord(e.dir, &pending, pendingExt))
	if again, err := Held(e.dir); err != nil || len(again) != len(want) {
		t.Fatalf("with a pending seed: %d digests (%v), want %d", len(again), err, len(want))
	}
}
