package clustersync

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Synced turns true, with one OnSynced call, once the sets and this Node's own labels are
// written: not while no Node of that name exists (with no labels, no set would seem to
// target the node, and the node condition would say Ready too early).
func TestSyncedOnlyWithTheNodesLabels(t *testing.T) {
	w := newWorld(t, setObject("a", "quay.io/x/a"+digest))
	w.syncer.cfg.NodeName = "worker-2"
	var calls atomic.Int32
	w.syncer.cfg.OnSynced = func() { calls.Add(1) }
	w.run(t)
	eventually(t, "the set written", func() bool {
		_, err := os.Stat(filepath.Join(w.syncer.Dir(), "a.json"))
		return err == nil
	})
	time.Sleep(300 * time.Millisecond)
	if w.syncer.Synced() || calls.Load() != 0 {
		t.Fatal("synced before the Node exists")
	}
	node := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "worker-2", Labels: map[string]string{"role": "x"}}}
	if _, err := w.meta.Resource(NodesResource).(interface {
		CreateFake(*metav1.PartialObjectMetadata, metav1.CreateOptions, ...string) (*metav1.PartialObjectMetadata, error)
	}).CreateFake(node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "synced", w.syncer.Synced)
	if b, _ := os.ReadFile(w.labels); len(b) == 0 {
		t.Fatal("synced before the labels file was written")
	}
	time.Sleep(200 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("OnSynced called %d times", n)
	}
}
