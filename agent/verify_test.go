package agent

import (
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
)

// On CRI-O an image removed behind imagepind's back (crictl rmi, podman rmi on the
// shared storage) sends no event: the periodic ListImages sees it gone, the set leaves
// Ready and the image is pulled (and pinned) again. Before the fix it stayed Ready
// forever with the image gone.
func TestImageRemovedBehindItsBackIsPulledAgain(t *testing.T) {
	h := newHarness(t)
	h.cfg.VerifyEvery = 100 * time.Millisecond
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	h.waitFor("Ready", phase("s", status.Ready))
	if h.rt.PullCount(a) != 1 {
		t.Fatalf("pulls %d", h.rt.PullCount(a))
	}
	h.rt.Remove(a)
	h.waitFor("pulled again and Ready", func(n status.Node) bool {
		return phase("s", status.Ready)(n) && h.rt.PullCount(a) == 2 && h.rt.Present(a)
	})
	if h.rt.PullCount(b) != 1 {
		t.Fatalf("an image still there was pulled again: %d", h.rt.PullCount(b))
	}
	// Settled: further verifications pull nothing.
	time.Sleep(500 * time.Millisecond)
	if h.rt.PullCount(a) != 2 || h.rt.PullCount(b) != 1 {
		t.Fatalf("pulls a=%d b=%d after settling", h.rt.PullCount(a), h.rt.PullCount(b))
	}
}

// LookNow (imagepind's reload, SIGHUP) looks at the runtime's images at once: an image
// removed behind imagepind's back comes back long before the next presence check.
func TestLookNowFindsARemovedImageAtOnce(t *testing.T) {
	h := newHarness(t)
	h.cfg.VerifyEvery = time.Hour
	a := img("a", 1)
	h.available(a)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.waitFor("Ready", phase("s", status.Ready))
	h.rt.Remove(a)
	time.Sleep(300 * time.Millisecond)
	if h.rt.PullCount(a) != 1 {
		t.Fatalf("pulled again before anything looked: %d pulls", h.rt.PullCount(a))
	}
	h.agent.LookNow()
	h.agent.LookNow() // a second call while the first waits is the same look
	h.waitFor("pulled again and Ready", func(n status.Node) bool {
		return phase("s", status.Ready)(n) && h.rt.PullCount(a) == 2 && h.rt.Present(a)
	})
}
