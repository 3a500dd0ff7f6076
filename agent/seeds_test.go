package agent

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/imagepin/imagepin/status"
)

// A seed, and a seed removed, change the node's status though nothing else does: the
// status is published on change only, and the seeds are part of what is compared. The
// seeds are asked with the references the sets pin (their tags too), and their faults
// are the node's.
func TestASeedIsAStatusChange(t *testing.T) {
	h := newHarness(t)
	a := img("app", 1)
	tagged := strings.Replace(a, "@", ":v1@", 1)
	h.available(a)
	var (
		mu     sync.Mutex
		seeded *status.Seeded
		faults []string
		asked  []string
	)
	h.seeds = func(pinned []string) (*status.Seeded, []string) {
		mu.Lock()
		defer mu.Unlock()
		asked = pinned
		return seeded, faults
	}
	h.start()
	h.writeFile("app.yaml", setDoc("app", tagged))
	h.waitFor("Ready", phase("app", status.Ready))
	h.pass()
	mu.Lock()
	if !slices.Contains(asked, a) || !slices.Contains(asked, tagged) {
		t.Errorf("the seeds were asked with %v, want the image %s and its tag %s", asked, a, tagged)
	}
	// Seeded: a pass (the seeds directory's watch pokes the loop) publishes it.
	seeded = &status.Seeded{Seeds: 1, Images: 1, Bytes: 1000}
	mu.Unlock()
	h.trigger()
	h.waitFor("the seed in the status", func(n status.Node) bool { return n.Node.Seeded != nil && n.Node.Seeded.Seeds == 1 })
	// A fault of the seeds.
	mu.Lock()
	faults = []string{"seed directory: /seed.d/bad.tar: refused"}
	mu.Unlock()
	h.trigger()
	h.waitFor("the seeds' fault", func(n status.Node) bool { return slices.Contains(n.Faults, "seed directory: /seed.d/bad.tar: refused") })
	// Removed.
	mu.Lock()
	seeded, faults = nil, nil
	mu.Unlock()
	h.trigger()
	h.waitFor("the seed gone from the status", func(n status.Node) bool { return n.Node.Seeded == nil && len(n.Faults) == 0 })
}
