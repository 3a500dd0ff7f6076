package seed

import (
	"context"
	"os"
	"path/filepath"
	"testing"
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
