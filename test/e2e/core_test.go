//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// A set file dropped in → every image present and pinned in CRI-O; status Ready.
func TestSetDroppedInIsPinnedAndPulled(t *testing.T) {
	w := newWorld(t)
	refs := w.push("app", 3)
	w.startDaemon()
	w.writeSet("app.yaml", alphaSet("app", refs...))
	n := w.waitFor("app Ready", 60*time.Second, phaseIs("app", status.Ready))
	w.requirePinned(refs...)
	s := n.Set("app")
	want, err := env.RuntimeVersion("crio")
	if err != nil {
		t.Fatal(err)
	}
	if s.ImagesReady != 3 || s.File != "app.yaml" || n.Node.Runtime.Version != want || n.Node.Runtime.Name != "cri-o" {
		t.Fatalf("status: %+v", n)
	}
	if !contains(w.livePins(), refs...) {
		t.Fatalf("CRI-O's live pinned_images %v lack %v", w.livePins(), refs)
	}
	if !w.crio.LogContains("Set config pinned_images") {
		t.Fatal("CRI-O never logged the pinned_images reload")
	}
	w.requireConfigParses()
}

// Two sets in both shapes, an administrator's drop-in, its edit, a removal, labels.
func TestSetsAdminPinsRemovalAndLabels(t *testing.T) {
	w := newWorld(t)
	a := w.push("alpha", 2)
	b := w.push("bravo", 2)
	admin := w.push("admin", 1)
	adminFile := filepath.Join(w.crio.ConfigDir, "10-admin.conf")
	os.WriteFile(adminFile, []byte("[crio.image]\npinned_images = [\""+admin[0]+"\"]\n"), 0o644)
	// The admin's image is pulled outside imagepin (as the MCO or a user would).
	if _, err := w.cri.PullImage(t.Context(), admin[0], nil); err != nil {
		t.Fatal(err)
	}
	w.startDaemon()
	w.writeSet("alpha.yaml", alphaSet("alpha", a...))
	w.writeSet("bravo.yaml", v1Set("bravo", "worker", b...))
	w.waitFor("both Ready", 60*time.Second, func(n status.Node) bool {
		return phaseIs("alpha", status.Ready)(n) && phaseIs("bravo", status.Ready)(n)
	})
	w.requirePinned(a...)
	w.requirePinned(b...)
	w.requirePinned(admin...) // our drop-in sorts last and carries the admin's pins

	// The administrator edits their drop-in: followed.
	other := w.push("admin-other", 1)
	w.cri.PullImage(t.Context(), other[0], nil)
	os.WriteFile(adminFile, []byte("[crio.image]\npinned_images = [\""+other[0]+"\"]\n"), 0o644)
	waitUntil(t, "the admin's edit followed", 30*time.Second, func() bool {
		return w.image(other[0]).Pinned && !w.image(admin[0]).Pinned
	})

	// A set removed: unpinned after unpin_delay (2s) but present; the other untouched.
	os.Remove(filepath.Join(w.setsDir, "bravo.yaml"))
	w.waitFor("bravo gone", 20*time.Second, func(n status.Node) bool { return n.Set("bravo") == nil })
	waitUntil(t, "bravo unpinned after unpin_delay", 30*time.Second, func() bool { return !w.image(b[0]).Pinned })
	for _, r := range b {
		if img := w.image(r); !img.Present || img.Pinned {
			t.Fatalf("%s after removal: present=%v pinned=%v, want present and unpinned", r, img.Present, img.Pinned)
		}
	}
	w.requirePinned(a...)

	// A node label change moves a set in and out.
	w.writeSet("masters.yaml", v1Set("masters", "master", b[0]))
	time.Sleep(time.Second)
	if n := w.readStatus(); n.Set("masters") != nil {
		t.Fatal("a master set applied to a worker")
	}
	os.WriteFile(w.labels, []byte(`{"node-role.kubernetes.io/master": ""}`), 0o644)
	w.waitFor("masters Ready", 30*time.Second, phaseIs("masters", status.Ready))
	w.requirePinned(b[0])
	os.WriteFile(w.labels, []byte(`{}`), 0o644)
	w.waitFor("masters gone", 30*time.Second, func(n status.Node) bool { return n.Set("masters") == nil })
	waitUntil(t, "masters' image unpinned after the node left the pool", 30*time.Second, func() bool { return !w.image(b[0]).Pinned })
	w.requireConfigParses()
}

// A malformed file and a tag reference → errors naming the file; nothing unpinned;
// CRI-O's config parses and a reload still works.
func TestBadFilesUnpinNothing(t *testing.T) {
	w := newWorld(t)
	refs := w.push("keep", 2)
	w.startDaemon()
	w.writeSet("keep.yaml", alphaSet("keep", refs...))
	w.waitFor("keep Ready", 60*time.Second, phaseIs("keep", status.Ready))
	before := w.livePins()

	w.writeSet("keep.yaml", alphaSet("keep", w.reg.Host+"/keep-0:latest"))
	w.writeSet("broken.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: broken\nspec: [")
	n := w.waitFor("two file errors", 20*time.Second, func(n status.Node) bool { return len(n.FileErrors) == 2 })
	var msgs []string
	for _, fe := range n.FileErrors {
		msgs = append(msgs, fe.File+" → "+fe.Error)
	}
	joined := strings.Join(msgs, "\n")
	if !strings.Contains(joined, "broken.yaml → broken.yaml: document 1") ||
		!strings.Contains(joined, `keep.yaml → keep.yaml: document 1 (set "keep"): spec.pinnedImages[0]: "`+w.reg.Host+`/keep-0:latest" is not by digest`) {
		t.Fatalf("file errors:\n%s", joined)
	}
	if s := n.Set("keep"); s == nil || s.Phase != status.Ready {
		t.Fatalf("keep must stay Ready on its last good content: %+v", n.Sets)
	}
	time.Sleep(3 * time.Second) // past unpin_delay
	w.requirePinned(refs...)
	if after := w.livePins(); !slices.Equal(before, after) {
		t.Fatalf("live pins changed: %v → %v", before, after)
	}
	w.requireConfigParses()

	// A CRI-O restart reads the same config (a broken drop-in would stop it starting).
	w.crio.Stop()
	if err := w.crio.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	w.waitFor("Ready after CRI-O restart", 60*time.Second, phaseIs("keep", status.Ready))
	w.requirePinned(refs...)
}
