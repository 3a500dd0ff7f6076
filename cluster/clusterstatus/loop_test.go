package clusterstatus

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	metafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/status"
)

const digest = "@sha256:1111111111111111111111111111111111111111111111111111111111111111"

type harness struct {
	store   *aggregator.Store
	loop    *Loop
	patches atomic.Int64
	nodes   int
	seq     uint64
}

func newHarness(t *testing.T, sets, nodes int, cfg Config) *harness {
	t.Helper()
	var objs []runtime.Object
	for i := 0; i < sets; i++ {
		objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind,
			"metadata": map[string]any{"name": fmt.Sprintf("set-%d", i), "uid": fmt.Sprintf("uid-%d", i), "generation": int64(1)},
			"spec":     map[string]any{"nodeSelector": map[string]any{}, "pinnedImages": []any{map[string]any{"name": "quay.io/a/b" + digest}}},
		}})
	}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.GroupVersionResource: "PinnedImageSetList"}, objs...)
	h := &harness{nodes: nodes}
	dyn.PrependReactor("patch", "pinnedimagesets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			h.patches.Add(1)
		}
		return false, nil, nil
	})
	mscheme := metafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(mscheme); err != nil {
		t.Fatal(err)
	}
	var nodeObjs []runtime.Object
	for i := 0; i < nodes; i++ {
		nodeObjs = append(nodeObjs, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}})
	}
	meta := metafake.NewSimpleMetadataClient(mscheme, nodeObjs...)
	log := logrus.New()
	log.SetOutput(io.Discard)
	cfg.Log = log
	h.store = aggregator.NewStore(aggregator.DefaultLimits(), time.Now)
	h.loop = New(dyn, meta, h.store, cfg)
	return h
}

// report sends every node's report of every set, with progress that moves each time.
func (h *harness) report(t *testing.T, sets int, ready bool) {
	t.Helper()
	h.seq++
	for i := 0; i < h.nodes; i++ {
		n := status.Node{Node: status.NodeInfo{Name: fmt.Sprintf("node-%d", i)}}
		for s := 0; s < sets; s++ {
			set := status.Set{Name: fmt.Sprintf("set-%d", s), Phase: status.Pulling, ImagesTotal: 1, BytesTotal: 1000, BytesReady: (h.seq * 7) % 1000}
			if ready {
				set.Phase, set.ImagesReady, set.BytesReady = status.Ready, 1, 1000
			}
			n.Sets = append(n.Sets, set)
		}
		if _, err := h.store.Ingest(n.Node.Name, v1.FromStatus(n, "boot", h.seq, time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

func (h *harness) run(t *testing.T) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	go h.loop.Run(ctx)
	go h.loop.Lead(ctx)
	t.Cleanup(cancel)
	return cancel
}

// Under constant churn a set is written at most once per MinInterval, whatever the node count.
func TestWritesBoundedPerSet(t *testing.T) {
	const sets, nodes = 3, 200
	h := newHarness(t, sets, nodes, Config{Tick: 10 * time.Millisecond, MinInterval: 300 * time.Millisecond, QPS: 1000, Burst: 1000, Warmup: time.Millisecond})
	h.report(t, sets, false)
	h.run(t)
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		h.report(t, sets, false)
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	got := h.patches.Load()
	max := int64(sets) * (int64(elapsed/(300*time.Millisecond)) + 2)
	if got == 0 || got > max {
		t.Fatalf("%d status writes in %s for %d sets and %d nodes; want 1..%d", got, elapsed, sets, nodes, max)
	}
	t.Logf("%d writes in %s (bound %d)", got, elapsed, max)
}

// All sets together stay under QPS.
func TestWritesBoundedOverall(t *testing.T) {
	const sets, nodes = 40, 20
	h := newHarness(t, sets, nodes, Config{Tick: 10 * time.Millisecond, MinInterval: time.Millisecond, QPS: 20, Burst: 1, Warmup: time.Millisecond})
	h.report(t, sets, false)
	h.run(t)
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		h.report(t, sets, false)
		time.Sleep(5 * time.Millisecond)
	}
	got := h.patches.Load()
	if max := int64(time.Since(start).Seconds()*20) + 2; got == 0 || got > max {
		t.Fatalf("%d writes, want 1..%d", got, max)
	}
}

// Nothing changes, nothing is written (after the first write of each set).
func TestNoWriteWithoutChange(t *testing.T) {
	const sets, nodes = 3, 10
	h := newHarness(t, sets, nodes, Config{Tick: 10 * time.Millisecond, MinInterval: 10 * time.Millisecond, QPS: 1000, Burst: 1000, Warmup: time.Millisecond})
	h.report(t, sets, true)
	h.run(t)
	deadline := time.Now().Add(5 * time.Second)
	for h.patches.Load() < sets && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	first := h.patches.Load()
	if first != sets {
		t.Fatalf("first writes %d, want %d", first, sets)
	}
	for i := 0; i < 50; i++ {
		h.report(t, sets, true) // heartbeats: same content
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.patches.Load(); got != first {
		t.Fatalf("%d writes for unchanged status", got-first)
	}
}

// A new leader writes nothing until every Node has reported (or the warm-up passes).
func TestWarmupWaitsForNodes(t *testing.T) {
	const sets, nodes = 2, 5
	h := newHarness(t, sets, nodes, Config{Tick: 10 * time.Millisecond, MinInterval: 10 * time.Millisecond, Warmup: time.Minute})
	h.run(t)
	time.Sleep(300 * time.Millisecond)
	if got := h.patches.Load(); got != 0 {
		t.Fatalf("%d writes before any node reported", got)
	}
	h.report(t, sets, true)
	deadline := time.Now().Add(5 * time.Second)
	for h.patches.Load() < sets && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := h.patches.Load(); got != sets {
		t.Fatalf("%d writes after every node reported, want %d", got, sets)
	}
}
