package seed

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// A pinned reference whose name a seed holds with another digest, and whose digest no
// seed holds, is a mismatch; one the seeds hold (as an image or an index's child), one
// of another tag, and one of another repository are not.
func TestMismatches(t *testing.T) {
	o := writeOCI(t, 30)
	e := newEnv(t, Deps{})
	if _, err := e.seeder.Seed(context.Background(), o.dir); err != nil {
		t.Fatal(err)
	}
	recs, err := Records(e.dir)
	must(t, err)
	nd, _ := o.named.Digest()
	im, _ := o.index.IndexManifest()
	child := im.Manifests[0].Digest.String()
	other, another := digest.FromString("converted").String(), digest.FromString("another").String()
	got := Mismatches(recs, []string{
		"quay.io/ns/app:v1@" + other,               // the tag, another digest
		"quay.io/ns/app@" + other,                  // the same, as a set's images name it: said once
		"quay.io/ns/app@" + another,                // the repository, another digest
		"quay.io/ns/app:v1@" + nd.String(),         // the seeded digest
		"quay.io/ns/app:v2@" + other,               // another tag
		"registry.example.com/team/multi@" + child, // an index's child
		"quay.io/ns/elsewhere:v1@" + other,         // another repository
		"quay.io/ns/app:v1",                        // no digest
		"quay.io/ns/app:v1@" + other,               // twice
	})
	if len(got) != 2 {
		t.Fatalf("mismatches %v, want quay.io/ns/app:v1@%s and quay.io/ns/app@%s", got, other, another)
	}
	tagged, repo := got[0], got[1]
	if !tagged.Tagged || tagged.Pinned != "quay.io/ns/app:v1@"+other || len(tagged.Seeded) != 1 || tagged.Seeded[0].Image.Digest.String() != nd.String() {
		t.Fatalf("the tag's mismatch: %+v", tagged)
	}
	msg := tagged.String()
	for _, want := range []string{"pinned quay.io/ns/app:v1@" + other + " is not seeded", "quay.io/ns/app:v1 as " + nd.String(), "--preserve-digests"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if repo.Tagged || repo.Pinned != "quay.io/ns/app@"+another || !strings.Contains(repo.String(), "only as v1@"+nd.String()) {
		t.Fatalf("the repository's mismatch: %+v: %s", repo, repo.String())
	}
}

// The node's status: the complete seeds summed, and as faults the mismatches and the
// watched directory's media faults (not those of a directory no longer watched).
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
	other := digest.FromString("converted").String()
	sd, faults := NewReport(e.dir, "/seed.d").Status([]string{"quay.io/ns/app:v1@" + other})
	if sd == nil || sd.Seeds != 1 || sd.Images != 3 || sd.Bytes == 0 {
		t.Fatalf("seeded %+v", sd)
	}
	if len(faults) != 2 || faults[0] != "seed directory: /seed.d/bad.tar: refused: truncated" || !strings.Contains(faults[1], "is not seeded") {
		t.Fatalf("faults %q", faults)
	}
	if _, faults := NewReport(e.dir, "/elsewhere").Status(nil); len(faults) != 0 {
		t.Fatalf("the faults of a directory not watched: %q", faults)
	}
	if _, faults := NewReport(e.dir, "").Status(nil); len(faults) != 0 {
		t.Fatalf("no directory watched: %q", faults)
	}
}
