package agent

import (
	"errors"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
)

// A joining node with the registry gone: its first pulls fail until the aggregator names
// its peers. When it does (SourcesChanged), the failed pulls are tried again at once,
// not after their backoff.
func TestFailedPullsAreTriedAgainWhenTheSourcesChange(t *testing.T) {
	h := newHarness(t)
	h.cfg.MaxBackoff = time.Hour
	a := img("a", 1)
	h.rt.SetRegistry(a, errors.New("pinging container registry registry.example: connection refused"))
	h.start()
	h.writeFile("apps.yaml", setDoc("apps", a))
	// Two failures: the second waits out a backoff of 2 s (±20 %).
	h.waitFor("a second failed pull", func(status.Node) bool { return h.rt.PullCount(a) >= 2 })
	h.available(a)
	start := time.Now()
	h.agent.SourcesChanged()
	h.waitFor("apps Ready", func(n status.Node) bool { s := n.Set("apps"); return s != nil && s.Phase == status.Ready })
	if took := time.Since(start); took > time.Second {
		t.Fatalf("the pull was tried again %s after the sources changed; want at once", took)
	}
}
