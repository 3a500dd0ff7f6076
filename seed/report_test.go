package seed

import (
	"context"
	"testing"
	"time"
)

// The node's status: the complete seeds summed, and as faults the watched directory's
// media faults (not those of a directory no longer watched).
func TestReport(t *testing.T) {
	o := writeOCI(t, 31)
	e := newEnv(t, Deps{})
	r := NewReport(e.dir, "/seed.d")
	if sd, faults := r.Status(nil); sd != nil || len(faults) != 0 {
		t.Fatalf("no seeds: %+v %v", sd, faults)
	}
	if _, err := e.seeder.Seed(context.Background(), o.dir); err != nil {
		t.Fatal(err)
	}
	must(t, WriteMediaFaults(e.dir, MediaFaults{Directory: "/seed.d", Updated: time.Now(),
		Media: []MediaFault{{Path: "/seed.d/bad.tar", Fault: "refused: truncated"}}}))
	sd, faults := NewReport(e.dir, "/seed.d").Status(nil)
	if sd == nil || sd.Seeds != 1 || sd.Images != 3 || sd.Bytes == 0 {
		t.Fatalf("seeded %+v", sd)
	}
	if len(faults) != 1 || faults[0] != "seed directory: /seed.d/bad.tar: refused: truncated" {
		t.Fatalf("faults %q", faults)
	}
	if _, faults := NewReport(e.dir, "/elsewhere").Status(nil); len(faults) != 0 {
		t.Fatalf("the faults of a directory not watched: %q", faults)
	}
	if _, faults := NewReport(e.dir, "").Status(nil); len(faults) != 0 {
		t.Fatalf("no directory watched: %q", faults)
	}
}
