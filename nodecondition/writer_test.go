package nodecondition

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/imagepin/imagepin/status"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// kubeletNode is a Node as the kubelet leaves it: its own conditions and a taint.
func kubeletNode() *corev1.Node {
	hb := metav1.NewTime(t0.Add(-time.Minute))
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-1", UID: "uid-1"},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "imagepin.io/images-not-ready", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: hb, LastTransitionTime: hb},
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: hb, LastTransitionTime: hb},
		}},
	}
}

type rig struct {
	t        *testing.T
	cs       *fake.Clientset
	clock    *clocktesting.FakeClock
	w        *Writer
	events   *record.FakeRecorder
	attempts atomic.Int64
	down     atomic.Bool
	running  bool
}

func newRig(t *testing.T, objs ...runtime.Object) *rig {
	r := &rig{t: t, cs: fake.NewSimpleClientset(objs...), clock: clocktesting.NewFakeClock(t0), events: record.NewFakeRecorder(100)}
	r.cs.PrependReactor("*", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "patch" {
			r.attempts.Add(1)
		}
		if r.down.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	r.w = New(Config{NodeName: "worker-1", Clock: r.clock, Log: log}, func() (kubernetes.Interface, error) { return r.cs, nil })
	r.w.newRecorder = func(kubernetes.Interface) (record.EventRecorder, func()) { return r.events, func() {} }
	return r
}

func (r *rig) run() {
	r.running = true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.w.Run(ctx); close(done) }()
	r.t.Cleanup(func() { cancel(); <-done })
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if f() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// update feeds the writer and, once it runs, waits for it to have acted on the update
// (read the clock and waited on it again): a step of the fake clock taken before that
// would pass a due time the writer has not asked for yet.
func (r *rig) update(n status.Node) {
	r.t.Helper()
	r.w.Update(n)
	if !r.running {
		return
	}
	r.w.mu.Lock()
	gen := r.w.gen
	r.w.mu.Unlock()
	eventually(r.t, "the writer acting on the update", func() bool { return r.w.waitingOn.Load() == gen })
}

// idle waits for the writer to have made n attempts and to wait on the clock again.
func (r *rig) idle(what string, n int64) {
	r.t.Helper()
	eventually(r.t, what, func() bool { return r.attempts.Load() == n && r.clock.HasWaiters() })
}

func (r *rig) node() *corev1.Node {
	n, err := r.cs.CoreV1().Nodes().Get(context.Background(), "worker-1", metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *rig) ours() *corev1.NodeCondition {
	for _, c := range r.node().Status.Conditions {
		if string(c.Type) == Type {
			return &c
		}
	}
	return nil
}

func nodeWith(sets ...status.Set) status.Node { return status.Node{Sets: sets} }

var (
	readyNode   = nodeWith(status.Set{Name: "base", Phase: status.Ready})
	pullingNode = nodeWith(status.Set{Name: "base", Phase: status.Pulling, ImagesReady: 1, ImagesTotal: 3})
)

// The condition is merged into the Node's status by type, through the status
// subresource: the kubelet's conditions and the taints stay exactly as they were.
func TestWriteKeepsTheKubeletsConditions(t *testing.T) {
	r := newRig(t, kubeletNode())
	before := kubeletNode().Status.Conditions
	r.update(pullingNode)
	r.run()
	r.idle("the first write", 1)
	r.clock.Step(2 * time.Second)
	r.update(readyNode)
	r.idle("the second write", 2)

	n := r.node()
	if len(n.Status.Conditions) != 3 {
		t.Fatalf("conditions %+v", n.Status.Conditions)
	}
	for _, c := range before {
		var got corev1.NodeCondition
		for _, g := range n.Status.Conditions {
			if g.Type == c.Type {
				got = g
			}
		}
		if got.Type != c.Type || got.Status != c.Status || got.Reason != c.Reason || !got.LastHeartbeatTime.Equal(&c.LastHeartbeatTime) {
			t.Errorf("the kubelet's condition %s changed: %+v", c.Type, got)
		}
	}
	if len(n.Spec.Taints) != 1 {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
	c := r.ours()
	if c.Status != corev1.ConditionTrue || c.Reason != ReasonAllSetsReady || !c.LastTransitionTime.Time.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("condition %+v", c)
	}
	for _, a := range r.cs.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			if p.GetSubresource() != "status" || p.GetPatchType() != types.StrategicMergePatchType {
				t.Fatalf("patch %s %s, want a strategic merge patch of status", p.GetSubresource(), p.GetPatchType())
			}
			if strings.Contains(string(p.GetPatch()), "Ready\"") && strings.Contains(string(p.GetPatch()), "KubeletReady") {
				t.Fatalf("the patch carries the kubelet's condition: %s", p.GetPatch())
			}
		}
	}
	// Events mark each change of status: first the evaluation, then Ready (recorded
	// right after the write).
	for _, want := range []string{"Normal PinnedImagesNotReady sets not Ready yet: base (Pulling 1/3 images)", "Normal PinnedImagesReady 1 of 1 sets Ready: base"} {
		select {
		case e := <-r.events.Events:
			if e != want {
				t.Fatalf("event %q, want %q", e, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no event %q", want)
		}
	}
}

// While the API is unreachable writes back off; when it answers, the latest condition
// is written, once.
func TestOutageThenRecovery(t *testing.T) {
	r := newRig(t, kubeletNode())
	r.update(readyNode)
	r.run()
	r.idle("the first write", 1)

	r.down.Store(true)
	r.update(pullingNode)
	r.clock.Step(2 * time.Second)
	r.idle("a failed write", 2)
	// Ten minutes of outage: 2 s doubling to 2 min is 2+4+8+16+32+64+120+120+120+120 s.
	r.tenMinutes()
	if n := r.attempts.Load(); n < 8 || n > 13 {
		t.Fatalf("%d attempts in ten minutes of outage; want a backoff", n)
	}
	// Meanwhile the set became Ready again and then failed: the latest wins.
	r.update(readyNode)
	failed := nodeWith(status.Set{Name: "base", Phase: status.Failed})
	r.update(failed)
	r.down.Store(false)
	attempts := r.attempts.Load()
	r.clock.Step(2 * time.Minute)
	r.idle("the write after the outage", attempts+1)
	c := r.ours()
	if c.Status != corev1.ConditionFalse || c.Reason != ReasonSetsDegraded {
		t.Fatalf("after the outage: %+v", c)
	}
	// True before the outage, False after: a warning.
	if e := lastEvent(r.events); !strings.HasPrefix(e, "Warning PinnedImagesNotReady sets failed") {
		t.Fatalf("event %q", e)
	}
}

func lastEvent(r *record.FakeRecorder) string {
	var last string
	for {
		select {
		case e := <-r.Events:
			last = e
		default:
			return last
		}
	}
}

// An unchanged condition is written once per heartbeat; a flapping one at most once
// per MinInterval, ending with the latest.
func TestWritesAreBounded(t *testing.T) {
	r := newRig(t, kubeletNode())
	r.update(readyNode)
	r.run()
	r.idle("the first write", 1)
	for i := range 12 {
		r.clock.Step(5 * time.Minute)
		r.idle("a heartbeat", int64(i+2))
	}
	hb := r.ours().LastHeartbeatTime
	if !hb.Time.Equal(t0.Add(time.Hour)) {
		t.Fatalf("heartbeat %s", hb)
	}
	if !r.ours().LastTransitionTime.Time.Equal(t0) {
		t.Fatal("a heartbeat moved the transition time")
	}

	// 1,000 flips within 10 s: at most one write per 2 s.
	start := r.attempts.Load()
	for i := range 1000 {
		// Faster than the writer acts: no waiting on it here.
		if i%2 == 0 {
			r.w.Update(pullingNode)
		} else {
			r.w.Update(readyNode)
		}
		if i%100 == 99 {
			r.clock.Step(time.Second)
		}
		time.Sleep(50 * time.Microsecond)
	}
	r.update(pullingNode)
	r.clock.Step(2 * time.Second)
	eventually(t, "the latest written", func() bool { c := r.ours(); return c.Status == corev1.ConditionFalse })
	if n := r.attempts.Load() - start; n > 7 {
		t.Fatalf("%d writes for 1,000 changes in 12 s", n)
	}
}

// A joining node: its condition is written False while its sets are pulled, and the
// sets turn Ready a moment later. The change to True (the startup taint waits for it)
// is written at once, not MinInterval after the write before; a change of the message
// alone still waits, and so does a change of status within MinInterval of the last.
func TestAChangeOfStatusIsNotHeldBackByTheWriteBefore(t *testing.T) {
	r := newRig(t, kubeletNode())
	r.update(pullingNode)
	r.run()
	r.idle("the first write", 1)
	r.update(nodeWith(status.Set{Name: "base", Phase: status.Pulling, ImagesReady: 2, ImagesTotal: 3}))
	time.Sleep(20 * time.Millisecond)
	r.idle("the message's change waiting", 1)
	r.update(readyNode)
	r.idle("True written without the clock moving", 2)
	eventually(t, "True in the API", func() bool { return r.ours().Status == corev1.ConditionTrue })
	if c := r.ours(); !c.LastTransitionTime.Time.Equal(t0) {
		t.Fatalf("condition %+v", c)
	}
	r.update(pullingNode)
	time.Sleep(20 * time.Millisecond)
	r.idle("False again waiting for MinInterval after True", 2)
	r.clock.Step(2 * time.Second)
	r.idle("False written", 3)
	eventually(t, "False in the API", func() bool { return r.ours().Status == corev1.ConditionFalse })
}

// A restarted imagepind keeps the transition time of the condition it finds in the API,
// and writes no event for a status that did not change.
func TestRestartKeepsTheTransitionTime(t *testing.T) {
	node := kubeletNode()
	since := metav1.NewTime(t0.Add(-time.Hour))
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: Type, Status: corev1.ConditionTrue,
		Reason: ReasonAllSetsReady, LastHeartbeatTime: since, LastTransitionTime: since})
	r := newRig(t, node)
	r.update(readyNode)
	r.run()
	r.idle("the first write", 1)
	c := r.ours()
	if !c.LastTransitionTime.Equal(&since) || !c.LastHeartbeatTime.Time.Equal(t0) {
		t.Fatalf("condition %+v", c)
	}
	if e := lastEvent(r.events); e != "" {
		t.Fatalf("event %q for an unchanged condition", e)
	}
}

// Before the cluster sync listed the sets, nothing is written: a node cannot say its
// sets are Ready before it knows which target it.
func TestNothingBeforeTheFirstSync(t *testing.T) {
	r := newRig(t, kubeletNode())
	r.update(status.Node{WaitingForClusterSync: true, Faults: []string{status.FaultWaitingForClusterSync}})
	r.run()
	time.Sleep(50 * time.Millisecond)
	r.clock.Step(time.Hour)
	time.Sleep(50 * time.Millisecond)
	if n := r.attempts.Load(); n != 0 || r.ours() != nil {
		t.Fatalf("%d writes before the first sync", n)
	}
}

func readyInAPI() *corev1.Node {
	node := kubeletNode()
	since := metav1.NewTime(t0.Add(-time.Hour))
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: Type, Status: corev1.ConditionTrue,
		Reason: ReasonAllSetsReady, LastHeartbeatTime: since, LastTransitionTime: since})
	return node
}

// A restarted imagepind whose sets wait to be confirmed (Pending) keeps the True it finds
// for up to StartupGrace: no False, no Event, if they are Ready within it; False after it.
func TestStartupGraceKeepsTrue(t *testing.T) {
	r := newRig(t, readyInAPI())
	r.update(pullingNode)
	r.run()
	eventually(t, "the writer waiting", r.clock.HasWaiters)
	r.clock.Step(30 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if n := r.attempts.Load(); n != 0 {
		t.Fatalf("%d writes within the grace", n)
	}
	r.update(readyNode)
	r.idle("the True written", 1)
	if c := r.ours(); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t0.Add(-time.Hour)) {
		t.Fatalf("condition %+v", c)
	}
	if e := lastEvent(r.events); e != "" {
		t.Fatalf("event %q", e)
	}

	r = newRig(t, readyInAPI())
	r.update(pullingNode)
	r.run()
	eventually(t, "the writer waiting", r.clock.HasWaiters)
	r.clock.Step(time.Minute)
	r.idle("the False written after the grace", 1)
	if c := r.ours(); c.Status != corev1.ConditionFalse {
		t.Fatalf("condition %+v", c)
	}

	// A Failed set is news at once.
	r = newRig(t, readyInAPI())
	r.update(nodeWith(status.Set{Name: "base", Phase: status.Failed}))
	r.run()
	r.idle("the Failed written", 1)
	if c := r.ours(); c.Reason != ReasonSetsDegraded {
		t.Fatalf("condition %+v", c)
	}
}

// A node joining: imagepind is up before its kubelet has registered the Node. The
// writer asks again every MinInterval however long that takes (not the outage's
// backoff, which reaches 2 minutes), so the condition, and with it the startup
// taint's removal, follows the Node's registration within MinInterval.
func TestANodeRegisteredLateIsWrittenWithinMinInterval(t *testing.T) {
	r := newRig(t)
	gets := r.countGets()
	r.w.cfg.JoinWait = time.Hour
	r.update(readyNode)
	r.run()
	eventually(t, "the first try", func() bool { return gets.Load() == 1 && r.clock.HasWaiters() })
	// Ten minutes without a Node: a try every 2 s.
	r.tenMinutes()
	if n := gets.Load(); n < 60 { // one every 2 s is 300; the outage backoff makes about 10
		t.Fatalf("%d tries in ten minutes without a Node; want one every 2 s", n)
	}
	if _, err := r.cs.CoreV1().Nodes().Create(context.Background(), kubeletNode(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.clock.Step(2 * time.Second)
	r.idle("the write once the Node is there", 1)
	if c := r.ours(); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("after the Node registered: %+v", c)
	}
}

// The same before the kubelet has written its kubeconfig (TLS bootstrap): no client yet,
// asked again every MinInterval.
func TestAKubeconfigWrittenLateIsUsedWithinMinInterval(t *testing.T) {
	r := newRig(t, kubeletNode())
	var tries atomic.Int64
	var written atomic.Bool
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	r.w = New(Config{NodeName: "worker-1", Clock: r.clock, Log: log}, func() (kubernetes.Interface, error) {
		tries.Add(1)
		if !written.Load() {
			return nil, fmt.Errorf("kubeconfig: %w", &fs.PathError{Op: "stat", Path: "/var/lib/kubelet/kubeconfig", Err: fs.ErrNotExist})
		}
		return r.cs, nil
	})
	r.w.newRecorder = func(kubernetes.Interface) (record.EventRecorder, func()) { return r.events, func() {} }
	r.w.cfg.JoinWait = time.Hour
	r.update(readyNode)
	r.run()
	eventually(t, "the first try", func() bool { return tries.Load() == 1 && r.clock.HasWaiters() })
	r.tenMinutes()
	if n := tries.Load(); n < 60 { // one every 2 s is 300; the outage backoff makes about 10
		t.Fatalf("%d tries in ten minutes without a kubeconfig; want one every 2 s", n)
	}
	written.Store(true)
	r.clock.Step(2 * time.Second)
	r.idle("the write once the kubeconfig is there", 1)
	if c := r.ours(); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("after the kubeconfig was written: %+v", c)
	}
}

// tenMinutes steps the clock ten minutes, a second at a time, letting the writer run
// between steps, and waits for it to wait on the clock again.
func (r *rig) tenMinutes() {
	r.t.Helper()
	for range 600 {
		// A step only once the writer waits on the clock: a loaded machine cannot make
		// it miss a due time.
		eventually(r.t, "the writer waiting", r.clock.HasWaiters)
		r.clock.Step(time.Second)
	}
	eventually(r.t, "the writer waiting", r.clock.HasWaiters)
}

// A Node that does not appear within JoinWait is more likely a name the kubelet does not
// register under: said once as a warning, then asked for as in an outage (backed off),
// not every 2 s for ever.
func TestANodeThatNeverAppearsIsBackedOffAfterJoinWait(t *testing.T) {
	r := newRig(t)
	gets := r.countGets()
	log, hook := logtest.NewNullLogger()
	r.w.cfg.Log, r.w.cfg.JoinWait = log, time.Minute
	r.update(readyNode)
	r.run()
	eventually(t, "the first try", func() bool { return gets.Load() == 1 && r.clock.HasWaiters() })
	r.tenMinutes()
	// 30 tries in the first minute, then 2 s doubling to 2 min: about 8 more.
	if n := gets.Load(); n < 30 || n > 50 {
		t.Fatalf("%d tries in ten minutes, JoinWait 1 min; want about 38", n)
	}
	warned := 0
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel {
			warned++
			if !strings.Contains(e.Message, "--hostname-override") {
				t.Errorf("warning %q does not say what to check", e.Message)
			}
		}
	}
	if warned != 1 {
		t.Fatalf("%d warnings; want one", warned)
	}
}

// countGets counts the writer's reads of the Node (each a try while it is not there).
func (r *rig) countGets() *atomic.Int64 {
	var gets atomic.Int64
	r.cs.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	return &gets
}
