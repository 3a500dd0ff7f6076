//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// The promise itself: a real kubelet's image garbage collector, run against the real
// CRI-O that imagepind manages, collects the unpinned images and spares every pinned one;
// once the set is removed and unpin_delay has passed, the next collection takes its
// images too. The disk check reads the same kubelet config for its threshold.
func TestKubeletGCSparesPinnedImages(t *testing.T) {
	kubeletGC(t, newWorldWith(t, func(string) env.CRIOOptions { return env.CRIOOptions{RootSize: "300m"} }))
}

// The same promise on containerd: the kubelet's GC spares what carries imagepind's label.
func TestContainerdKubeletGCSparesPinnedImages(t *testing.T) {
	kubeletGC(t, newContainerdWorld(t, func(string) env.ContainerdOptions { return env.ContainerdOptions{RootSize: "300m"} }))
}

// kubeletGC is the kubelet GC scenario on the world's runtime (its image filesystem
// 300 MiB).
func kubeletGC(t *testing.T, w *world) {
	kdir := filepath.Join(w.dir, "kubelet")
	os.MkdirAll(kdir, 0o755)
	kubelet, err := env.NewKubelet(kdir, w.socket(), env.KubeletGC{HighThresholdPercent: 90, LowThresholdPercent: 80, EvictionImagefsAvailable: "1Gi"})
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{kubeletConfig: kubelet.Config})
	pinned := w.push("gc-pinned", 3)
	loose := w.push("gc-loose", 3)
	w.startDaemon()
	w.writeSet("keep.yaml", alphaSet("keep", pinned...))
	n := w.waitFor("keep Ready", 60*time.Second, phaseIs("keep", status.Ready))
	w.requirePinned(pinned...)
	// The disk check and the kubelet read one file: the GC threshold agrees.
	if c := n.Set("keep").Condition(status.ConditionDiskChecked); c == nil || !strings.Contains(c.Message, "image GC starts at 90%") {
		t.Fatalf("the disk check does not use the kubelet's threshold: %+v", c)
	}
	ctx := context.Background()
	ids := map[string]string{} // image ID → reference
	for _, ref := range pinned {
		ids[w.image(ref).ID] = ref
	}
	for _, ref := range loose {
		if _, err := w.cri.PullImage(ctx, ref, nil); err != nil {
			t.Fatal(err)
		}
		img := w.image(ref)
		if !img.Present || img.Pinned {
			t.Fatalf("%s: present=%v pinned=%v", ref, img.Present, img.Pinned)
		}
		ids[img.ID] = ref
	}

	if err := kubelet.Start(nodeNameForKubelet); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log:\n%s", kubelet.LogTail(40))
			if b, err := os.ReadFile(kubelet.LogFile); err == nil {
				os.WriteFile(filepath.Join(os.TempDir(), "imagepin-e2e-kubelet.log"), b, 0o644)
			}
		}
		kubelet.Stop()
	})
	gone := func(refs []string) func() bool {
		return func() bool {
			if kubelet.Exited() {
				t.Fatalf("the kubelet exited:\n%s", kubelet.LogTail(40))
			}
			for _, r := range refs {
				if w.image(r).Present {
					return false
				}
			}
			return true
		}
	}
	waitUntil(t, "the kubelet to collect the unpinned images", 120*time.Second, gone(loose))
	w.requirePinned(pinned...)
	// The kubelet's own account: a removal line for each loose image, none for a pinned
	// one, and its "pinned, skipping" line for each pinned image.
	for _, ref := range loose {
		if len(kubelet.Lines("Removing image to free bytes", strings.TrimPrefix(w.image2ID(ids, ref), "sha256:"))) == 0 {
			t.Fatalf("no kubelet removal line for %s", ref)
		}
	}
	var shown []string
	for _, ref := range pinned {
		id := strings.TrimPrefix(w.image2ID(ids, ref), "sha256:")
		if l := kubelet.Lines("Removing image", id); len(l) != 0 {
			t.Fatalf("the kubelet tried to remove pinned %s: %s", ref, l[0])
		}
		skips := kubelet.Lines("Image is pinned, skipping garbage collection", id)
		if len(skips) == 0 {
			t.Fatalf("no kubelet skip line for pinned %s", ref)
		}
		shown = append(shown, skips[0])
	}
	t.Logf("kubelet collected:\n%s", strings.Join(kubelet.Lines("Removing image to free bytes"), "\n"))
	t.Logf("kubelet skipped:\n%s", strings.Join(shown, "\n"))

	// The set goes: after unpin_delay its images are unpinned, and the next collection
	// takes them; imagepind itself deleted nothing.
	os.Remove(filepath.Join(w.setsDir, "keep.yaml"))
	waitUntil(t, "the removed set's images collected", 120*time.Second, gone(pinned))
	var collected []string
	for _, ref := range pinned {
		l := kubelet.Lines("Removing image to free bytes", strings.TrimPrefix(w.image2ID(ids, ref), "sha256:"))
		if len(l) == 0 {
			t.Fatalf("no kubelet removal line for %s once unpinned", ref)
		}
		collected = append(collected, l[0])
	}
	t.Logf("kubelet collected once the set was removed:\n%s", strings.Join(collected, "\n"))
	if w.ctr == nil {
		w.requireConfigParses()
	}
}

const nodeNameForKubelet = "e2e-node"

// image2ID is the image ID recorded for ref before the collection.
func (w *world) image2ID(ids map[string]string, ref string) string {
	for id, r := range ids {
		if r == ref {
			return id
		}
	}
	w.t.Fatalf("no recorded ID for %s", ref)
	return ""
}
