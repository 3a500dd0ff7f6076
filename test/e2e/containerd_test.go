//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// newContainerdWorld is a world whose runtime is a real containerd 2.x (options may
// depend on the world's registry host); imagepind finds it by CRI Version.
func newContainerdWorld(t *testing.T, options func(registry string) env.ContainerdOptions) *world {
	t.Helper()
	w := baseWorld(t)
	var opts env.ContainerdOptions
	if options != nil {
		opts = options(w.reg.Host)
	}
	opts.Insecure = append(opts.Insecure, w.reg.Host)
	c, err := env.NewContainerd(filepath.Join(w.dir, "containerd"), opts)
	if err != nil {
		t.Fatal(err)
	}
	w.ctr = c
	w.run(c.Start, c.Cleanup)
	return w
}

func (w *world) containerdImages() *containerd.Images {
	w.t.Helper()
	images, err := containerd.DialImages(w.ctr.Socket, "k8s.io")
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { images.Close() })
	return images
}

// labelled says whether the image record carries the CRI plugin's pinned label.
func (w *world) labelled(ref string) bool {
	w.t.Helper()
	labels, err := w.containerdImages().Labels(context.Background(), ref)
	if err != nil {
		w.t.Fatalf("labels of %s: %v", ref, err)
	}
	return labels[containerd.PinnedLabel] == containerd.PinnedLabelValue
}

// recorded is what imagepind's state says it labelled.
func (w *world) recorded() []string {
	w.t.Helper()
	var r struct {
		Labeled []string `json:"labeled"`
	}
	b, _ := os.ReadFile(filepath.Join(w.dir, "state", "containerd-labels.json"))
	json.Unmarshal(b, &r)
	return r.Labeled
}

// On containerd: a set is pulled and pinned (the label on each record, CRI pinned=true),
// an administrator's own label is kept and never removed, the label a kubelet-style
// re-pull drops is put back, and a removed set is unpinned after unpin_delay, its
// images kept.
func TestContainerdPinPullUnpinAdminKept(t *testing.T) {
	w := newContainerdWorld(t, nil)
	ctx := t.Context()
	app := w.push("app", 3)
	admin := w.push("admin", 1)
	// The administrator pulled and pinned this one by hand (ctr image label …).
	if _, err := w.cri.PullImage(ctx, admin[0], nil); err != nil {
		t.Fatal(err)
	}
	if err := w.containerdImages().SetPinned(ctx, admin[0], true); err != nil {
		t.Fatal(err)
	}
	w.startDaemon()
	all := append(slices.Clone(app), admin...)
	w.writeSet("app.yaml", alphaSet("app", all...))
	n := w.waitFor("app Ready", 60*time.Second, phaseIs("app", status.Ready))
	want, err := env.RuntimeVersion("containerd")
	if err != nil {
		t.Fatal(err)
	}
	if n.Node.Runtime.Name != "containerd" || n.Node.Runtime.Version != want || n.Set("app").ImagesReady != 4 {
		t.Fatalf("status: %+v", n)
	}
	w.requirePinned(all...)
	for _, r := range all {
		if !w.labelled(r) {
			t.Fatalf("%s has no pinned label", r)
		}
	}
	if rec := w.recorded(); !slices.Equal(rec, sortedCopy(app)) {
		t.Fatalf("imagepind's record %v, want exactly the images it labelled %v (not the administrator's)", rec, app)
	}
	if ps := w.pins(); !contains(ps, all...) {
		t.Fatalf("pinned records %v lack %v", ps, all)
	}

	// The kubelet pulls an image a pod needs whether or not it is there
	// (imagePullPolicy: Always). containerd 2.x's pull replaces the record's labels:
	// imagepind sees the image event and puts the label back.
	if _, err := w.cri.PullImage(ctx, app[0], nil); err != nil {
		t.Fatal(err)
	}
	pulled := time.Now()
	waitUntil(t, "imagepind puts the pin back after a re-pull", 10*time.Second, func() bool {
		return w.image(app[0]).Pinned && w.labelled(app[0])
	})
	t.Logf("a kubelet-style re-pull dropped the label; imagepind put it back within %s", time.Since(pulled).Round(time.Millisecond))
	w.waitFor("app Ready again", 20*time.Second, phaseIs("app", status.Ready))

	// The set removed: after unpin_delay (2 s) imagepind's labels go; the images stay;
	// the administrator's label stays.
	os.Remove(filepath.Join(w.setsDir, "app.yaml"))
	w.waitFor("app gone", 20*time.Second, func(n status.Node) bool { return n.Set("app") == nil })
	waitUntil(t, "app unpinned after unpin_delay", 30*time.Second, func() bool { return !w.image(app[2]).Pinned })
	for _, r := range app {
		if img := w.image(r); !img.Present || img.Pinned || w.labelled(r) {
			t.Fatalf("%s after removal: present=%v pinned=%v labelled=%v; want present, unpinned", r, img.Present, img.Pinned, w.labelled(r))
		}
	}
	w.requirePinned(admin...)
	if !w.labelled(admin[0]) {
		t.Fatal("imagepind removed a label it did not set")
	}
	if rec := w.recorded(); len(rec) != 0 {
		t.Fatalf("record after unpinning: %v", rec)
	}
}

// The disk check on containerd: its image filesystem (CRI ImageFsInfo: the snapshotter's
// directory) on an 80 MiB tmpfs; a set needing 96 MiB is refused, nothing pulled or
// labelled; one that fits goes Ready.
func TestContainerdDiskRefusal(t *testing.T) {
	w := newContainerdWorld(t, func(string) env.ContainerdOptions { return env.ContainerdOptions{RootSize: "80m"} })
	big := w.pushBig("big", 6)
	small := w.pushBig("small", 2)
	w.startDaemon()
	w.writeSet("huge.yaml", alphaSet("huge", big...))
	n := w.waitFor("huge refused", 60*time.Second, phaseIs("huge", status.Failed))
	c := n.Set("huge").Condition(status.ConditionFailed)
	if c.Reason != status.ReasonInsufficientDiskSpace || !strings.Contains(c.Message, "6 images need 96.0 MiB") ||
		!strings.Contains(c.Message, w.ctr.Root()) || !strings.Contains(c.Message, "free of 80.0 MiB") {
		t.Fatalf("refusal: %+v", c)
	}
	time.Sleep(time.Second)
	for _, r := range big {
		if w.image(r).Present {
			t.Fatalf("%s was pulled", r)
		}
	}
	if ps := w.pins(); len(ps) != 0 {
		t.Fatalf("labelled: %v", ps)
	}
	w.writeSet("small.yaml", alphaSet("small", small...))
	w.waitFor("small Ready", 60*time.Second, phaseIs("small", status.Ready))
	w.requirePinned(small...)
}

// kill -9 in the middle of pulling on containerd: started again, imagepind converges,
// every image labelled and recorded.
func TestContainerdKill9MidPull(t *testing.T) {
	w := newContainerdWorld(t, nil)
	w.writeConfig(worldOptions{pullConcurrency: 1})
	var refs []string
	for i := 0; i < 16; i++ {
		img, err := w.reg.PushRandom(context.Background(), fmt.Sprintf("big-%d", i), 2, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, img.Ref())
	}
	w.startDaemon()
	w.writeSet("big.yaml", alphaSet("big", refs...))
	waitUntil(t, "a first pull", 60*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(w.dir, "imagepind.log"))
		return strings.Contains(string(b), "msg=pulled")
	})
	if n := w.readStatus(); n.Set("big") == nil || n.Set("big").Phase != status.Pulling {
		s := n.Set("big")
		t.Fatalf("not mid-pull: %+v", s)
	}
	w.daemon.Process.Signal(syscall.SIGKILL)
	<-w.daemonCh
	w.daemon = nil
	w.startDaemon()
	w.waitFor("Ready after kill -9", 120*time.Second, phaseIs("big", status.Ready))
	w.requirePinned(refs...)
	if rec := w.recorded(); !slices.Equal(rec, sortedCopy(refs)) {
		t.Fatalf("record %v, want every image", rec)
	}
}

// Hostile files on a containerd node: the same scenario as on CRI-O.
func TestContainerdHostileInput(t *testing.T) { hostileInput(t, newContainerdWorld(t, nil)) }

// A disconnected containerd node: the source does not exist and only its pull-only
// mirror in hosts.toml answers. The disk check sizes the images through the same
// hosts.toml (translated), containerd pulls through it, and the one image the mirror
// lacks is ImageUnavailable, never pulled.
func TestContainerdDisconnectedThroughHostsMirror(t *testing.T) {
	w := newContainerdWorld(t, func(registry string) env.ContainerdOptions {
		return env.ContainerdOptions{Mirrors: map[string]string{"upstream.example.invalid": registry}}
	})
	disconnectedThroughMirror(t, w)
	// imagepinctl check reads the same hosts.toml.
	out, err := exec.Command(filepath.Join(binDir, "imagepinctl"), "check", "--config", w.config, filepath.Join(w.setsDir, "release.yaml")).CombinedOutput()
	if !strings.Contains(string(out), w.reg.Host+"/ocp/gone") {
		t.Fatalf("imagepinctl check (%v):\n%s", err, out)
	}
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}
