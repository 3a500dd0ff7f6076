package starttaint

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/imagepin/imagepin/cluster/replica"
)

const cond = "PinnedImagesReady"

var (
	ours  = corev1.Taint{Key: DefaultKey, Effect: corev1.TaintEffectNoSchedule}
	other = corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}
	added = corev1.Taint{Key: "example.com/maintenance", Value: "x", Effect: corev1.TaintEffectNoExecute}
)

func node(name string, status corev1.ConditionStatus, taints ...corev1.Taint) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}, Spec: corev1.NodeSpec{Taints: taints}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if status != "" {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: cond, Status: status, Message: "1 of 1 sets Ready: base"})
	}
	return n
}

type rig struct {
	t       *testing.T
	cs      *fake.Clientset
	r       *Remover
	events  *record.FakeRecorder
	patches atomic.Int64
}

func newRig(t *testing.T, objs ...runtime.Object) *rig {
	g := &rig{t: t, cs: fake.NewSimpleClientset(objs...), events: record.NewFakeRecorder(100)}
	g.cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		g.patches.Add(1)
		return false, nil, nil
	})
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel)
	g.r = New(g.cs, g.events, Config{Key: DefaultKey, Condition: cond, Log: log})
	return g
}

func (g *rig) lead() context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.r.Lead(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	g.t.Cleanup(stop)
	return stop
}

func (g *rig) get(name string) *corev1.Node {
	n, err := g.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		g.t.Fatal(err)
	}
	return n
}

func (g *rig) setCondition(name string, s corev1.ConditionStatus) {
	n := g.get(name)
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == cond {
			n.Status.Conditions[i].Status = s
		}
	}
	if _, err := g.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		g.t.Fatal(err)
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if f() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// The taint goes once the condition is True, with an Event, and only that taint; the
// condition turning False later puts nothing back.
func TestRemovedOnceNeverPutBack(t *testing.T) {
	g := newRig(t, node("new", corev1.ConditionFalse, other, ours), node("plain", corev1.ConditionTrue, other), node("silent", "", ours))
	g.lead()
	time.Sleep(200 * time.Millisecond)
	if g.patches.Load() != 0 || !hasTaint(g.get("new"), DefaultKey) {
		t.Fatal("the taint went while the condition was False")
	}
	g.setCondition("new", corev1.ConditionTrue)
	eventually(t, "the taint removed", func() bool { return !hasTaint(g.get("new"), DefaultKey) })
	if n := g.get("new"); len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != other {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
	if e := <-g.events.Events; !strings.HasPrefix(e, "Normal StartupTaintRemoved taint imagepin.io/images-not-ready removed: PinnedImagesReady is True") {
		t.Fatalf("event %q", e)
	}
	g.setCondition("new", corev1.ConditionFalse)
	g.setCondition("new", corev1.ConditionTrue)
	time.Sleep(300 * time.Millisecond)
	if hasTaint(g.get("new"), DefaultKey) || g.patches.Load() != 1 || g.r.Removed() != 1 {
		t.Fatalf("patches %d, removed %d", g.patches.Load(), g.r.Removed())
	}
	// A node without the condition (no imagepind yet) keeps its taint.
	if !hasTaint(g.get("silent"), DefaultKey) {
		t.Fatal("the taint went from a node that never reported")
	}
}

// A taint added while the remover works is kept: the patch tests the index it read, a
// shifted list fails the test, and the retry reads the newer object.
func TestConcurrentTaintKept(t *testing.T) {
	g := newRig(t, node("n", corev1.ConditionTrue, other, ours))
	var raced atomic.Bool
	g.cs.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if raced.Swap(true) {
			return false, nil, nil
		}
		// Another controller puts its taint first, between our read and our patch.
		n, err := g.cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", "n")
		if err != nil {
			return true, nil, err
		}
		n2 := n.(*corev1.Node).DeepCopy()
		n2.Spec.Taints = append([]corev1.Taint{added}, n2.Spec.Taints...)
		n2.ResourceVersion = "2"
		return false, nil, g.cs.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n2, "")
	})
	g.lead()
	eventually(t, "the taint removed", func() bool { return !hasTaint(g.get("n"), DefaultKey) })
	n := g.get("n")
	if len(n.Spec.Taints) != 2 || n.Spec.Taints[0] != added || n.Spec.Taints[1] != other {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
	if p := g.patches.Load(); p < 2 {
		t.Fatalf("%d patches: the first should have failed its test", p)
	}
}

// Only the leader removes: a standby leaves the taint, the replica that takes the Lease
// removes it, and after losing it removes nothing more.
func TestOnlyTheLeaderRemoves(t *testing.T) {
	g := newRig(t, node("a", corev1.ConditionTrue, ours))
	terms := make(chan context.Context)
	rep := replica.New(replica.Config{
		Elect: func(ctx context.Context, lead func(context.Context)) error {
			for {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case term := <-terms:
					lead(term)
				}
			}
		},
		Serve: func(ctx context.Context, ready func()) error { ready(); <-ctx.Done(); return nil },
		Write: g.r.Lead,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rep.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	time.Sleep(300 * time.Millisecond)
	if !hasTaint(g.get("a"), DefaultKey) {
		t.Fatal("a standby removed the taint")
	}
	term, endTerm := context.WithCancel(context.Background())
	terms <- term
	eventually(t, "the leader removing the taint", func() bool { return !hasTaint(g.get("a"), DefaultKey) })
	endTerm()
	eventually(t, "the term over", func() bool { return !rep.Leading() })
	if _, err := g.cs.CoreV1().Nodes().Create(context.Background(), node("b", corev1.ConditionTrue, ours), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if !hasTaint(g.get("b"), DefaultKey) || g.r.Removed() != 1 {
		t.Fatal("a replica that lost the Lease removed a taint")
	}
}
