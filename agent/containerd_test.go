package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/fakeruntime"
)

func newContainerdHarness(t *testing.T) *harness {
	h := newHarness(t)
	h.rt = fakeruntime.NewContainerd()
	h.containerd = true
	return h
}

// The shared flow on containerd: pins are labels on image records, set right after each
// pull; one an administrator set stays theirs; a label a re-pull drops and a record
// deleted behind imagepind's back are put right from containerd's image events; a
// removed set's labels go after unpin_delay, its images stay.
func TestContainerdPinsByLabel(t *testing.T) {
	h := newContainerdHarness(t)
	a, b, adm := img("a", 1), img("b", 2), img("admin", 3)
	h.available(a, b, adm)
	if _, err := h.rt.PullImage(t.Context(), adm, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.SetPinned(t.Context(), adm, true); err != nil {
		t.Fatal(err)
	}
	h.start()
	h.writeFile("s.yaml", setDoc("s", a, b, adm))
	n := h.waitFor("Ready", phase("s", status.Ready))
	if n.Node.Runtime.Name != "containerd" {
		t.Fatalf("runtime %+v", n.Node.Runtime)
	}
	for _, ref := range []string{a, b, adm} {
		if !h.rt.Labeled(ref) {
			t.Fatalf("%s not labelled", ref)
		}
	}
	if h.rt.ReloadCount() != 0 {
		t.Fatal("containerd needs no reload")
	}

	// A kubelet-style pull of a: containerd drops the label; imagepind puts it back.
	if _, err := h.rt.PullImage(t.Context(), a, nil); err != nil {
		t.Fatal(err)
	}
	h.waitFor("a labelled again", func(status.Node) bool { return h.rt.Labeled(a) })

	// b deleted by hand (crictl rmi): pulled and labelled again.
	pulls := h.rt.PullCount(b)
	h.rt.Remove(b)
	h.waitFor("b back", func(status.Node) bool { return h.rt.Present(b) && h.rt.Labeled(b) && h.rt.PullCount(b) == pulls+1 })
	h.waitFor("Ready again", phase("s", status.Ready))

	// The set removed: after unpin_delay imagepind's labels go, the administrator's stays.
	os.Remove(filepath.Join(h.cfg.SetsDir, "s.yaml"))
	h.trigger()
	h.waitFor("unlabelled", func(status.Node) bool { return !h.rt.Labeled(a) && !h.rt.Labeled(b) })
	if !h.rt.Labeled(adm) || !h.rt.Present(a) || !h.rt.Present(b) {
		t.Fatalf("admin label %v, a present %v, b present %v", h.rt.Labeled(adm), h.rt.Present(a), h.rt.Present(b))
	}
}

// A state lost between runs: imagepind's record of its labels (beside the state) keeps
// them pinned after a restart, and they go after unpin_delay once no set wants them.
func TestContainerdRestartKeepsLabels(t *testing.T) {
	h := newContainerdHarness(t)
	a := img("a", 1)
	h.available(a)
	h.start()
	h.writeFile("s.yaml", setDoc("s", a))
	h.waitFor("Ready", phase("s", status.Ready))
	h.stop()
	os.Remove(filepath.Join(h.store.Dir(), "state.json"))
	os.Remove(filepath.Join(h.cfg.SetsDir, "s.yaml"))
	h.start()
	h.waitFor("a pass", func(n status.Node) bool { return n.Node.Runtime.Name == "containerd" })
	if !h.rt.Labeled(a) {
		t.Fatal("a restart with a lost state unpinned at once")
	}
	h.waitFor("released after unpin_delay", func(status.Node) bool { return !h.rt.Labeled(a) })
}

// While pulls stream in, containerd reports each image record they create (without the
// pin label, which the pull's worker sets as it returns): those events wait for the
// next full pass due, as pull results do, rather than each bringing a pass of its own
// on the loop (which delayed the next pulls' start by a label write each). Labels are
// all in place at Ready all the same.
func TestContainerdEventsDuringPullsShareAPass(t *testing.T) {
	h := newContainerdHarness(t)
	h.cfg.PullConcurrency = 4
	var imgs []string
	for i := 0; i < 24; i++ {
		imgs = append(imgs, img(fmt.Sprintf("app-%02d", i), i+1))
	}
	h.available(imgs...)
	h.rt.PullDelay = 30 * time.Millisecond
	obs := &countingObserver{}
	h.observer = obs
	h.start()
	h.waitFor("the first pass", func(status.Node) bool { return obs.count() > 0 })
	before := obs.count()
	h.writeFile("s.yaml", setDoc("s", imgs...))
	h.waitFor("Ready", phase("s", status.Ready))
	// 24 pulls, 4 at once, 30 ms each: about 180 ms of pulls, so a pass every 200 ms
	// (fullPassEvery) plus those of the set's change, the check, the last pull: a few.
	// One pass per image's create event made it 24 and more.
	n := obs.count() - before
	t.Logf("%d full passes for %d pulls", n, len(imgs))
	if n >= len(imgs)/2 {
		t.Fatalf("%d full passes for %d pulls: the runtime's events each brought one", n, len(imgs))
	}
	for _, ref := range imgs {
		if !h.rt.Labeled(ref) {
			t.Fatalf("%s not labelled at Ready", ref)
		}
	}
}
