//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/diskcheck"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// newSmallDiskWorld is a world whose CRI-O stores images on an 80 MiB tmpfs.
func newSmallDiskWorld(t *testing.T) *world {
	return newWorldWith(t, func(string) env.CRIOOptions { return env.CRIOOptions{RootSize: "80m"} })
}

// pushBig pushes n images of two 4 MiB random (incompressible) layers: 8 MiB each, so
// a need of 16 MiB each at the default multiplier of 2.
func (w *world) pushBig(prefix string, n int) []string {
	w.t.Helper()
	var refs []string
	for i := 0; i < n; i++ {
		img, err := w.reg.PushRandom(context.Background(), fmt.Sprintf("%s-%d", prefix, i), 2, 4<<20)
		if err != nil {
			w.t.Fatal(err)
		}
		refs = append(refs, img.Ref())
	}
	return refs
}

func (w *world) requireAbsentAndUnpinned(refs ...string) {
	w.t.Helper()
	live := w.livePins()
	for _, r := range refs {
		if img := w.image(r); img.Present {
			w.t.Fatalf("%s was pulled", r)
		}
		if slices.Contains(live, r) {
			w.t.Fatalf("%s was pinned", r)
		}
	}
}

// On an 80 MiB image filesystem (GC at 85% = 68 MiB): a set needing 96 MiB is refused
// with nothing pinned or pulled; two sets of 48 MiB each fit alone but not together:
// the first (by name) is admitted and goes Ready, the second is refused, and stays
// refused once the first has landed.
func TestDiskCheckOnASmallImageFilesystem(t *testing.T) {
	w := newSmallDiskWorld(t)
	big := w.pushBig("big", 6)
	first := w.pushBig("first", 3)
	second := w.pushBig("second", 3)
	w.startDaemon()

	w.writeSet("huge.yaml", alphaSet("huge", big...))
	n := w.waitFor("huge refused", 60*time.Second, phaseIs("huge", status.Failed))
	s := n.Set("huge")
	c := s.Condition(status.ConditionFailed)
	d := s.Condition(status.ConditionDiskChecked)
	if c.Reason != status.ReasonInsufficientDiskSpace || d.Status != status.False ||
		// The manifests decide: 96 MiB at the floor is more than 80 MiB, whatever the
		// layers decompress to, so no uncompressed size is asked.
		// The need is a range: the floor, to the most the layers' formats can hold.
		!strings.Contains(c.Message, "node e2e-node: 6 images need 96.0 MiB to 48.0 GiB (2 × 48.0 MiB of layers; uncompressed sizes not asked: the real need lies between the floor and the most the layers' formats can hold, and the verdict is the same at either end) on "+w.crio.Root()) ||
		!strings.Contains(c.Message, "free of 80.0 MiB; image GC starts at 85%") {
		t.Fatalf("refusal: %+v / %+v", c, d)
	}
	if s.BytesTotal < 48<<20 || n.Node.ImageFilesystem.CapacityBytes != 80<<20 || !strings.HasPrefix(n.Node.ImageFilesystem.Path, w.crio.Root()) {
		t.Fatalf("bytes %d, filesystem %+v", s.BytesTotal, n.Node.ImageFilesystem)
	}
	time.Sleep(time.Second)
	w.requireAbsentAndUnpinned(big...)

	os.Remove(filepath.Join(w.setsDir, "huge.yaml"))
	before, err := diskcheck.Statfs(w.crio.Root())
	if err != nil {
		t.Fatal(err)
	}
	w.writeSet("aa-first.yaml", alphaSet("aa-first", first...))
	w.writeSet("bb-second.yaml", alphaSet("bb-second", second...))
	n = w.waitFor("first Ready, second refused", 60*time.Second, func(n status.Node) bool {
		return phaseIs("aa-first", status.Ready)(n) && phaseIs("bb-second", status.Failed)(n)
	})
	if c := n.Set("bb-second").Condition(status.ConditionFailed); c.Reason != status.ReasonInsufficientDiskSpace {
		t.Fatalf("second: %+v", c)
	}
	w.requirePinned(first...)
	w.requireAbsentAndUnpinned(second...)
	after, _ := diskcheck.Statfs(w.crio.Root())
	est := n.Set("aa-first").BytesTotal * 2
	grew := after.Used() - before.Used()
	t.Logf("accuracy: estimated need %s, storage grew by %s: estimate / growth = %.2f", bytesize.Human(est), bytesize.Human(grew), float64(est)/float64(grew))

	// The second stays refused now that the first has landed (its real use counts).
	time.Sleep(3 * time.Second)
	n = w.readStatus()
	if s := n.Set("bb-second"); s == nil || s.Phase != status.Failed {
		t.Fatalf("second after the first landed: %+v", s)
	}
	w.requireAbsentAndUnpinned(second...)
}

// A disconnected cluster: the set names images at a source that does not exist; only
// its digest mirror answers. The disk check sizes them through the mirror (the same
// registries.conf as CRI-O), CRI-O pulls them through it, and the pins match the names
// CRI-O records (the source's).
func TestDisconnectedClusterThroughMirror(t *testing.T) {
	w := newMirrorWorld(t)
	s := disconnectedThroughMirror(t, w)
	if c := s.Condition(status.ConditionFailed); c.Reason != status.ReasonImageUnavailable {
		t.Fatalf("%+v", c)
	}
	if !strings.Contains(s.FailedImages[0].Error, "upstream.example.invalid/ocp/gone") {
		t.Fatalf("the unavailable image must list every endpoint tried: %+v", s.FailedImages)
	}
}

// disconnectedThroughMirror runs a disconnected node's set on w, whose runtime reaches
// upstream.example.invalid only through a mirror on the world's registry: three images
// the mirror has and one it lacks (gone). The three are sized through the mirror, pulled
// and pinned; gone is Failed, names the mirror tried, and is never pulled.
func disconnectedThroughMirror(t *testing.T, w *world) *status.Set {
	t.Helper()
	refs, gone := w.pushUpstreamComponents(3)
	w.startDaemon()
	w.writeSet("release.yaml", alphaSet("release", append(refs, gone)...))
	n := w.waitFor("Failed on the unavailable image only", 60*time.Second, func(n status.Node) bool {
		s := n.Set("release")
		return s != nil && s.Phase == status.Failed && s.ImagesReady == 3
	})
	s := n.Set("release")
	if len(s.FailedImages) != 1 || s.FailedImages[0].Image != gone || !strings.Contains(s.FailedImages[0].Error, w.reg.Host+"/ocp/gone") {
		t.Fatalf("the unavailable image must name the mirror tried: %+v", s.FailedImages)
	}
	if s.BytesTotal == 0 || s.Condition(status.ConditionDiskChecked).Status != status.True {
		t.Fatalf("sized through the mirror: bytes %d, %+v", s.BytesTotal, s.Condition(status.ConditionDiskChecked))
	}
	w.requirePinned(refs...)
	if w.image(gone).Present {
		t.Fatal("the unavailable image was pulled")
	}
	return s
}

// newMirrorWorld is a disconnected cluster: upstream.example.invalid/ocp exists only as a
// digest mirror on the world's registry.
func newMirrorWorld(t *testing.T) *world {
	return newWorldWith(t, func(registry string) env.CRIOOptions {
		return env.CRIOOptions{Mirrors: map[string]string{"upstream.example.invalid/ocp": registry + "/ocp"}}
	})
}

// pushUpstreamComponents pushes n images as ocp/component-N and names them at a source
// that does not exist (upstream.example.invalid), which only a mirror serves; gone is
// one the mirror does not have.
func (w *world) pushUpstreamComponents(n int) (refs []string, gone string) {
	w.t.Helper()
	for i := 0; i < n; i++ {
		img, err := w.reg.PushRandom(context.Background(), fmt.Sprintf("ocp/component-%d", i), 1, 256<<10)
		if err != nil {
			w.t.Fatal(err)
		}
		refs = append(refs, fmt.Sprintf("upstream.example.invalid/ocp/component-%d@%s", i, img.Digest))
	}
	return refs, "upstream.example.invalid/ocp/gone@sha256:" + strings.Repeat("0", 64)
}
