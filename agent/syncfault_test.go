package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
)

// writeClusterFile writes a file as the cluster sync does, into <sets_dir>/cluster.
func (h *harness) writeClusterFile(name, content string) {
	h.t.Helper()
	dir := filepath.Join(h.cfg.SetsDir, pinset.ClusterSubdir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	h.trigger()
}

// With the cluster sync on, the cluster subdirectory disappearing (an rsync --delete of
// the sets directory, an rm -rf sets/*) is a sync fault: the cluster sets stay, pinned,
// while local files are still followed. Before the fix every cluster set was unpinned
// after unpin_delay with no fault.
func TestClusterSubdirRemovedKeepsTheClusterSets(t *testing.T) {
	h := newHarness(t)
	h.cfg.ClusterSync = true
	a, b, c := img("a", 1), img("b", 2), img("c", 3)
	h.available(a, b, c)
	h.start()
	h.writeClusterFile("from-api.json", setDoc("from-api", a))
	h.writeFile("local.yaml", setDoc("local", b))
	h.waitFor("Ready", func(n status.Node) bool { return phase("from-api", status.Ready)(n) && phase("local", status.Ready)(n) })

	if err := os.RemoveAll(filepath.Join(h.cfg.SetsDir, pinset.ClusterSubdir)); err != nil {
		t.Fatal(err)
	}
	h.writeFile("local2.yaml", setDoc("local2", c)) // local files are still followed
	n := h.waitFor("fault and the new local set", func(n status.Node) bool {
		return len(n.Faults) > 0 && phase("local2", status.Ready)(n)
	})
	if !strings.Contains(n.Faults[0], "cluster subdirectory is missing") || !strings.Contains(n.Faults[0], "nothing is unpinned") {
		t.Fatalf("fault %q", n.Faults[0])
	}
	if n.Set("from-api") == nil || n.Set("from-api").Phase != status.Ready {
		t.Fatalf("cluster set dropped: %+v", n.Sets)
	}
	time.Sleep(2 * h.cfg.UnpinDelay)
	h.pass()
	if !slices.Contains(h.rt.Pinned(), a) {
		t.Fatal("a cluster set was unpinned on a sync fault")
	}
	// The same across a restart.
	h.stop()
	h.start()
	h.waitFor("restarted with the cluster set", phase("from-api", status.Ready))
	// The sync restores the directory without the set (deleted in the API meanwhile):
	// that is a real deletion, unpinned after the delay.
	if err := os.MkdirAll(filepath.Join(h.cfg.SetsDir, pinset.ClusterSubdir), 0o755); err != nil {
		t.Fatal(err)
	}
	h.trigger()
	h.waitFor("no fault, set gone", func(n status.Node) bool { return len(n.Faults) == 0 && n.Set("from-api") == nil })
	h.waitFor("unpinned after the delay", func(status.Node) bool { return !slices.Contains(h.rt.Pinned(), a) })
}

// Without the cluster sync a missing cluster subdirectory is simply no cluster sets.
func TestClusterSubdirMissingWithoutSyncIsNoSets(t *testing.T) {
	h := newHarness(t)
	a := img("a", 1)
	h.available(a)
	h.start()
	h.writeClusterFile("x.json", setDoc("x", a))
	h.waitFor("Ready", phase("x", status.Ready))
	os.RemoveAll(filepath.Join(h.cfg.SetsDir, pinset.ClusterSubdir))
	h.trigger()
	n := h.waitFor("gone", func(n status.Node) bool { return n.Set("x") == nil })
	if len(n.Faults) != 0 {
		t.Fatalf("faults %v", n.Faults)
	}
}

// A local file wins a name clash with a cluster set, live and after a restart whose sets
// directory is missing (the last good contents are replayed in the live read's order).
// Before the fix the replay took cluster/foo.json (sorting before z-foo.yaml), so the
// local set's images were unpinned while the fault said nothing is.
func TestNameClashReplayKeepsTheLiveWinner(t *testing.T) {
	h := newHarness(t)
	h.cfg.ClusterSync = true
	local, cluster := img("local", 1), img("cluster", 2)
	h.available(local, cluster)
	h.start()
	h.writeClusterFile("foo.json", setDoc("foo", cluster))
	h.writeFile("z-foo.yaml", setDoc("foo", local))
	n := h.waitFor("local wins", func(n status.Node) bool {
		s := n.Set("foo")
		return s != nil && s.File == "z-foo.yaml" && s.Phase == status.Ready && len(n.FileErrors) == 1
	})
	if n.FileErrors[0].File != "cluster/foo.json" {
		t.Fatalf("file errors %+v", n.FileErrors)
	}
	h.stop()
	if err := os.Rename(h.cfg.SetsDir, h.cfg.SetsDir+".gone"); err != nil {
		t.Fatal(err)
	}
	h.start()
	n = h.waitFor("restarted with a fault", func(n status.Node) bool { return len(n.Faults) > 0 && n.Set("foo") != nil })
	if s := n.Set("foo"); s.File != "z-foo.yaml" {
		t.Fatalf("after the restart the set comes from %s", s.File)
	}
	time.Sleep(2 * h.cfg.UnpinDelay)
	h.pass()
	if !slices.Contains(h.rt.Pinned(), local) {
		t.Fatalf("the local set's image was unpinned: %v", h.rt.Pinned())
	}
}

// Until the cluster sync has written its first lists, the node's status says so as a
// fact (WaitingForClusterSync, which the node condition reads) and in words among the
// faults; both go once it has.
func TestWaitingForTheClusterSyncIsAFact(t *testing.T) {
	h := newHarness(t)
	h.cfg.ClusterSync = true
	var synced atomic.Bool
	h.sourceSynced = synced.Load
	a := img("a", 1)
	h.available(a)
	h.start()
	h.writeFile("local.yaml", setDoc("local", a))
	n := h.waitFor("Ready while waiting", phase("local", status.Ready))
	if !n.WaitingForClusterSync || !slices.Contains(n.Faults, status.FaultWaitingForClusterSync) {
		t.Fatalf("before the first sync: waiting %v, faults %q", n.WaitingForClusterSync, n.Faults)
	}
	synced.Store(true)
	h.writeClusterFile("from-api.json", setDoc("from-api", a)) // the sync's first write
	n = h.waitFor("synced", func(n status.Node) bool { return phase("from-api", status.Ready)(n) })
	if n.WaitingForClusterSync || slices.Contains(n.Faults, status.FaultWaitingForClusterSync) {
		t.Fatalf("after the first sync: waiting %v, faults %q", n.WaitingForClusterSync, n.Faults)
	}
}
