package agent

import (
	"slices"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
)

// While the disk check of a new set runs, its images are pinned and the pins confirmed
// (a pin of an image the node does not hold takes no room), and nothing is pulled; the
// verdict admits the set and the pulls start with the pins in effect, no reload more.
func TestPinsWhileTheCheckRuns(t *testing.T) {
	h := newHarness(t)
	disk := &fakeDisk{mode: "admit", gate: make(chan struct{})}
	h.disk = disk
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	h.waitFor("pinned while the check runs", func(status.Node) bool {
		p := h.rt.Pinned()
		return slices.Contains(p, a) && slices.Contains(p, b)
	})
	h.pass()
	if h.rt.PullCount(a)+h.rt.PullCount(b) != 0 || h.rt.Present(a) {
		t.Fatalf("pulled before the verdict: a %d, b %d", h.rt.PullCount(a), h.rt.PullCount(b))
	}
	n := h.latestStatus()
	if s := n.Set("s"); s == nil || s.Phase == status.Ready {
		t.Fatalf("Ready before the verdict: %+v", s)
	}
	reloads := h.rt.ReloadCount()
	close(disk.gate)
	h.waitFor("Ready", phase("s", status.Ready))
	if h.rt.ReloadCount() != reloads {
		t.Fatalf("the verdict reloaded the runtime again (%d→%d): the pins were in effect", reloads, h.rt.ReloadCount())
	}
	if p := h.rt.Pinned(); !slices.Contains(p, a) || !slices.Contains(p, b) {
		t.Fatalf("pinned %v", p)
	}
}

// A verdict refusing the set takes away at once (not after unpin_delay) the pins
// written while it ran; an image of the set the node holds keeps its pin, as always.
func TestPinsWhileTheCheckRunsGoWhenItRefuses(t *testing.T) {
	h := newHarness(t)
	h.cfg.UnpinDelay = time.Hour
	disk := &fakeDisk{mode: "refuse", gate: make(chan struct{})}
	h.disk = disk
	a, b, c := img("a", 1), img("b", 2), img("c", 3)
	h.available(a, b, c)
	if _, err := h.rt.PullImage(t.Context(), c, nil); err != nil { // the kubelet pulled it
		t.Fatal(err)
	}
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b, c))
	h.waitFor("pinned while the check runs", func(status.Node) bool {
		p := h.rt.Pinned()
		return slices.Contains(p, a) && slices.Contains(p, b) && slices.Contains(p, c)
	})
	close(disk.gate)
	n := h.waitFor("refused", phase("s", status.Failed))
	if c := n.Set("s").Condition(status.ConditionReady); c.Reason != status.ReasonInsufficientDiskSpace {
		t.Fatalf("%+v", c)
	}
	h.waitFor("unpinned at once", func(status.Node) bool {
		p := h.rt.Pinned()
		return !slices.Contains(p, a) && !slices.Contains(p, b)
	})
	h.pass()
	if p := h.rt.Pinned(); !slices.Contains(p, c) {
		t.Fatalf("the image present lost its pin: %v", p)
	}
	if h.rt.PullCount(a)+h.rt.PullCount(b) != 0 || h.rt.PullCount(c) != 1 {
		t.Fatalf("a refused set pulled: a %d, b %d", h.rt.PullCount(a), h.rt.PullCount(b))
	}
	d, err := h.store.Load()
	if err != nil || len(d.Unchecked) != 0 || len(d.Pins) != 1 {
		t.Fatalf("state: pins %v, unchecked %v, %v", d.Pins, d.Unchecked, err)
	}
}

// Without PinWhileChecking (a node whose pins let the node-local mirror fill its store)
// nothing missing is pinned before the verdict, nor pulled: the check is asked for no
// early pulls, whatever it would offer.
func TestNoPinsWhileTheCheckRunsWhenTheyTakeDisk(t *testing.T) {
	h := newHarness(t)
	h.cfg.PinWhileChecking = false
	a := img("a", 1)
	disk := &fakeDisk{mode: "admit", gate: make(chan struct{}), early: []string{a}}
	h.disk = disk
	h.available(a)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.pass()
	h.pass()
	if p := h.rt.Pinned(); slices.Contains(p, a) {
		t.Fatalf("pinned before the verdict: %v", p)
	}
	if h.rt.PullCount(a) != 0 {
		t.Fatal("pulled before the verdict")
	}
	close(disk.gate)
	h.waitFor("Ready", phase("s", status.Ready))
	if p := h.rt.Pinned(); !slices.Contains(p, a) {
		t.Fatalf("pinned %v", p)
	}
	disk.mu.Lock()
	defer disk.mu.Unlock()
	if disk.asked == 0 || disk.askedEarly != 0 {
		t.Fatalf("%d checks, %d of them allowed to offer early pulls", disk.asked, disk.askedEarly)
	}
}

// A restart while the check runs keeps what the pins written meanwhile are: the state
// says they are unchecked, so the verdict after the restart that refuses the set takes
// them away at once too (not after unpin_delay, as pins the state does not know).
func TestPinsWhileTheCheckRunsSurviveARestart(t *testing.T) {
	h := newHarness(t)
	h.cfg.UnpinDelay = time.Hour
	disk := &fakeDisk{mode: "refuse", gate: make(chan struct{})}
	h.disk = disk
	a := img("a", 1)
	h.available(a)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.waitFor("pinned while the check runs", func(status.Node) bool { return slices.Contains(h.rt.Pinned(), a) })
	h.stop() // the check never answered
	if d, err := h.store.Load(); err != nil || !d.Unchecked[a] {
		t.Fatalf("the state does not say the pin is unchecked: %v, %v", d.Unchecked, err)
	}

	disk.mu.Lock()
	disk.gate = nil
	disk.mu.Unlock()
	h.start()
	h.waitFor("refused", phase("s", status.Failed))
	h.waitFor("unpinned at once", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), a) })
	if h.rt.PullCount(a) != 0 {
		t.Fatalf("a refused set pulled %d times", h.rt.PullCount(a))
	}
}
