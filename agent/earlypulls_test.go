package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
)

// What the check under way lets be pulled before its verdict (diskcheck.Early) is pulled,
// pinned, while the check sizes the rest; the others wait for the verdict, which
// admits the set: every image pulled, each pin checked, nothing left marked early.
func TestEarlyPullsStartBeforeTheVerdict(t *testing.T) {
	h := newHarness(t)
	a, b, c := img("a", 1), img("b", 2), img("c", 3)
	disk := &fakeDisk{mode: "admit", gate: make(chan struct{}), early: []string{a, b}}
	h.disk = disk
	h.available(a, b, c)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b, c))
	h.waitFor("a and b pulled before the verdict", func(status.Node) bool { return h.rt.Present(a) && h.rt.Present(b) })
	if !h.rt.PinnedAtPull(a) || !h.rt.PinnedAtPull(b) {
		t.Fatal("pulled early before its pin was in effect")
	}
	h.pass()
	if h.rt.PullCount(c) != 0 {
		t.Fatal("c pulled before the verdict, which the check did not let")
	}
	if p := h.rt.Pinned(); !slices.Contains(p, a) || !slices.Contains(p, b) {
		t.Fatalf("pulled early but not pinned: %v", p)
	}
	if n := h.latestStatus(); n.Set("s").Phase == status.Ready {
		t.Fatal("Ready before the verdict")
	}
	if d, err := h.store.Load(); err != nil || !d.PulledEarly[a] || !d.PulledEarly[b] || !d.Unchecked[a] {
		t.Fatalf("state: early %v, unchecked %v, %v", d.PulledEarly, d.Unchecked, err)
	}
	close(disk.gate)
	h.waitFor("Ready", phase("s", status.Ready))
	if h.rt.PullCount(a) != 1 || h.rt.PullCount(c) != 1 {
		t.Fatalf("pulls: a %d, c %d", h.rt.PullCount(a), h.rt.PullCount(c))
	}
	h.pass()
	if d, err := h.store.Load(); err != nil || len(d.PulledEarly) != 0 || len(d.Unchecked) != 0 || len(d.Pins) != 3 {
		t.Fatalf("state after the verdict: early %v, unchecked %v, pins %v, %v", d.PulledEarly, d.Unchecked, d.Pins, err)
	}
}

// A verdict refusing the set takes the pins of the images pulled before it away at once
// (not after unpin_delay): the node holds them only because of the early pulls. They stay
// on the node, unpinned, for the kubelet's image GC; the rest is never pulled. An image
// the node held before keeps its pin, as always.
func TestEarlyPullsLoseTheirPinsWhenTheVerdictRefuses(t *testing.T) {
	h := newHarness(t)
	h.cfg.UnpinDelay = time.Hour
	a, b, held := img("a", 1), img("b", 2), img("held", 3)
	disk := &fakeDisk{mode: "refuse", gate: make(chan struct{}), early: []string{a}}
	h.disk = disk
	h.available(a, b, held)
	if _, err := h.rt.PullImage(t.Context(), held, nil); err != nil { // the kubelet pulled it
		t.Fatal(err)
	}
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b, held))
	h.waitFor("a pulled before the verdict", func(status.Node) bool { return h.rt.Present(a) && slices.Contains(h.rt.Pinned(), a) })
	close(disk.gate)
	n := h.waitFor("refused", phase("s", status.Failed))
	if msg := n.Set("s").Condition(status.ConditionFailed).Message; !strings.Contains(msg, "; the 1 images already present stay pinned; the 1 pulled while the check ran stay on the node, unpinned") {
		t.Fatalf("refusal: %q", msg)
	}
	h.waitFor("a unpinned at once", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), a) })
	h.pass()
	if !h.rt.Present(a) {
		t.Fatal("the image pulled early was removed: imagepind never deletes images")
	}
	if h.rt.PullCount(b) != 0 {
		t.Fatal("a refused set pulled an image the check did not let be pulled early")
	}
	if p := h.rt.Pinned(); !slices.Contains(p, held) {
		t.Fatalf("the image the node held lost its pin: %v", p)
	}
	// The mark stays while the refused set wants it, or the next pass would pin it for
	// being on the node.
	if d, err := h.store.Load(); err != nil || !d.PulledEarly[a] || len(d.Unchecked) != 0 || len(d.Pins) != 1 {
		t.Fatalf("state: early %v, unchecked %v, pins %v, %v", d.PulledEarly, d.Unchecked, d.Pins, err)
	}
	os.Remove(filepath.Join(h.cfg.SetsDir, "s.yaml"))
	h.trigger()
	h.waitFor("the set gone", func(n status.Node) bool { return n.Set("s") == nil })
	h.pass()
	if d, err := h.store.Load(); err != nil || len(d.PulledEarly) != 0 {
		t.Fatalf("state once the set left: early %v, %v", d.PulledEarly, err)
	}
}

// A restart after early pulls, before the verdict: the state says they were pulled
// early, so the refusal after the restart takes their pins away at once too.
func TestEarlyPullsSurviveARestart(t *testing.T) {
	h := newHarness(t)
	h.cfg.UnpinDelay = time.Hour
	a, b := img("a", 1), img("b", 2)
	disk := &fakeDisk{mode: "refuse", gate: make(chan struct{}), early: []string{a}}
	h.disk = disk
	h.available(a, b)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	h.waitFor("a pulled before the verdict", func(status.Node) bool { return h.rt.Present(a) && slices.Contains(h.rt.Pinned(), a) })
	h.pass()
	h.stop()
	disk.mu.Lock()
	disk.early = nil
	disk.mu.Unlock()
	h.start()
	h.pass()
	if p := h.rt.Pinned(); !slices.Contains(p, a) {
		t.Fatalf("the restart dropped the pin before any verdict: %v", p)
	}
	close(disk.gate)
	h.waitFor("refused", phase("s", status.Failed))
	h.waitFor("a unpinned at once", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), a) })
	if h.rt.PullCount(b) != 0 || !h.rt.Present(a) {
		t.Fatalf("b pulled %d times; a present %v", h.rt.PullCount(b), h.rt.Present(a))
	}
}

// No early pulls while pulls the check does not count can land meanwhile: an admitted
// set still pulling gains an image, and the check of it is asked for no early pulls
// (the room it measures would not hold them beside the pulls under way).
func TestNoEarlyPullsWhilePullsRun(t *testing.T) {
	h := newHarness(t)
	a, b, c := img("a", 1), img("b", 2), img("c", 3)
	disk := &fakeDisk{mode: "admit"}
	h.disk = disk
	h.available(a, b, c)
	h.rt.PullDelay = 300 * time.Millisecond
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	h.waitFor("admitted, pulling", func(status.Node) bool { return h.rt.PullCount(a) > 0 })
	disk.mu.Lock()
	before := disk.asked
	disk.mu.Unlock()
	h.writeFile("s.yaml", setDoc("s", a, b, c))
	h.waitFor("checked again", func(status.Node) bool {
		disk.mu.Lock()
		defer disk.mu.Unlock()
		return disk.asked > before
	})
	disk.mu.Lock()
	early := disk.askedEarly
	disk.mu.Unlock()
	if early != 1 { // the set's first check only
		t.Fatalf("%d checks allowed to offer early pulls; want the first only", early)
	}
	h.waitFor("Ready", phase("s", status.Ready))
}

// Images pulled early, then a check that fails as a whole (no verdict), then one that
// admits the set: the images are present by then, so that verdict does not name them
// among those it counted, yet their pins are checked pins from then on. A later refusal
// (the set gains an image past the room) keeps them pinned, as any pin that exists.
func TestEarlyPullsAreOrdinaryPinsOnceAdmitted(t *testing.T) {
	h := newHarness(t)
	h.cfg.UnpinDelay = time.Hour
	h.cfg.MaxBackoff = 50 * time.Millisecond
	a, b, c := img("a", 1), img("b", 2), img("c", 3)
	disk := &fakeDisk{mode: "fail", gate: make(chan struct{}), early: []string{a}}
	h.disk = disk
	h.available(a, b, c)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b))
	h.waitFor("a pulled before the verdict", func(status.Node) bool { return h.rt.Present(a) })
	close(disk.gate)
	h.waitFor("the check failed and is tried again", func(status.Node) bool {
		disk.mu.Lock()
		defer disk.mu.Unlock()
		return disk.asked >= 2
	})
	disk.mu.Lock()
	disk.mode, disk.early = "admit", nil
	disk.mu.Unlock()
	h.waitFor("Ready", phase("s", status.Ready))
	if d, err := h.store.Load(); err != nil || len(d.PulledEarly) != 0 || len(d.Unchecked) != 0 {
		t.Fatalf("state once admitted: early %v, unchecked %v, %v", d.PulledEarly, d.Unchecked, err)
	}
	disk.set("refuse")
	h.writeFile("s.yaml", setDoc("s", a, b, c))
	h.waitFor("refused", phase("s", status.Failed))
	h.pass()
	if p := h.rt.Pinned(); !slices.Contains(p, a) || !slices.Contains(p, b) {
		t.Fatalf("a refusal unpinned what the set held: %v", p)
	}
}

// A set refused before and checked again: what the new check lets be pulled early is
// pinned before its pull, as for a set not judged yet, and its pin goes at once when the
// new verdict refuses the set too.
func TestEarlyPullsOfASetRefusedBeforeArePinned(t *testing.T) {
	h := newHarness(t)
	h.cfg.UnpinDelay = time.Hour
	a, b := img("a", 1), img("b", 2)
	disk := &fakeDisk{mode: "refuse"}
	h.disk = disk
	h.available(a, b)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.waitFor("refused", phase("s", status.Failed))
	disk.mu.Lock()
	disk.gate, disk.early = make(chan struct{}), []string{a}
	disk.mu.Unlock()
	h.writeFile("s.yaml", setDoc("s", a, b)) // a change: checked again
	h.waitFor("a pulled before the new verdict", func(status.Node) bool { return h.rt.Present(a) })
	if !h.rt.PinnedAtPull(a) {
		t.Fatalf("a pulled early without its pin in effect: %v", h.rt.Pinned())
	}
	close(disk.gate)
	h.waitFor("a unpinned at once", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), a) })
	if h.rt.PullCount(b) != 0 {
		t.Fatal("b pulled")
	}
}

// pull_while_checking = false: pins still go in while the check runs, but the check
// is asked for no early pulls and nothing is pulled before the verdict. (Without
// PinWhileChecking: TestNoPinsWhileTheCheckRunsWhenTheyTakeDisk.)
func TestNoEarlyPullsWhenTurnedOff(t *testing.T) {
	h := newHarness(t)
	h.cfg.PullEarly = false
	a := img("a", 1)
	disk := &fakeDisk{mode: "admit", gate: make(chan struct{}), early: []string{a}}
	h.disk = disk
	h.available(a)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.waitFor("pinned while the check runs", func(status.Node) bool { return slices.Contains(h.rt.Pinned(), a) })
	h.pass()
	if h.rt.PullCount(a) != 0 {
		t.Fatal("pulled before the verdict")
	}
	close(disk.gate)
	h.waitFor("Ready", phase("s", status.Ready))
	disk.mu.Lock()
	defer disk.mu.Unlock()
	if disk.asked == 0 || disk.askedEarly != 0 {
		t.Fatalf("%d checks, %d of them allowed to offer early pulls", disk.asked, disk.askedEarly)
	}
}
