package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/fakeruntime"
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

// heldListing is the fake runtime whose ImageNames, once armed, answers what the runtime
// held when it was asked but returns only when released: a presence check under way.
type heldListing struct {
	*fakeruntime.Runtime
	armed   atomic.Bool
	asked   chan struct{}
	release chan struct{}
}

func (h *heldListing) ImageNames(ctx context.Context) (map[string]string, error) {
	names, err := h.Runtime.ImageNames(ctx)
	if h.armed.CompareAndSwap(true, false) {
		h.asked <- struct{}{}
		<-h.release
	}
	return names, err
}

// A reload that comes while a presence check is under way (it listed the runtime's
// images before the administrator removed one) looks again as soon as that check ends,
// not at the next check.
func TestLookNowDuringALookLooksAgain(t *testing.T) {
	h := newHarness(t)
	h.cfg.VerifyEvery = time.Hour
	a := img("a", 1)
	h.available(a)
	held := &heldListing{Runtime: h.rt, asked: make(chan struct{}, 1), release: make(chan struct{})}
	h.runtime = held
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.waitFor("Ready", phase("s", status.Ready))
	held.armed.Store(true)
	h.agent.LookNow()
	<-held.asked // the listing has the image
	h.rt.Remove(a)
	h.agent.LookNow() // the administrator's reload, after the removal
	time.Sleep(200 * time.Millisecond)
	close(held.release)
	h.waitFor("pulled again and Ready", func(n status.Node) bool {
		return phase("s", status.Ready)(n) && h.rt.PullCount(a) == 2 && h.rt.Present(a)
	})
}
