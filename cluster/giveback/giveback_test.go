package giveback

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	ns        = "imagepin"
	condition = "PinnedImagesReady"
	taint     = "imagepin.io/images-not-ready"
)

var (
	normal    = []string{"/imagepind"}
	uninstall = []string{"/imagepind", "uninstall", "--wait", "--config=/etc/imagepin/imagepind.toml"}
	ready     = []string{"/imagepind", "uninstall", "--status", "--config=/etc/imagepin/imagepind.toml"}
)

func daemonSet(desired int32) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "imagepind", Namespace: ns, UID: "ds-uid", Generation: 1},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "imagepind"}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptr(intstr.FromInt32(1))}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app.kubernetes.io/name": "imagepind"}},
				Spec: corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{{
					Name: "imagepind", Image: "quay.io/imagepin/imagepin:0.1.0", Command: normal,
					Args: []string{"--config=/etc/imagepin/imagepind.toml", "--node-name=$(NODE_NAME)"},
					Env:  []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
				}}},
			},
		},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: desired, ObservedGeneration: 1},
	}
}

// pod is the DaemonSet's pod on node running command, ready or not.
func pod(name, node string, command []string, isReady bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if isReady {
		status = corev1.ConditionTrue
	}
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/name": "imagepind"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "imagepind", UID: "ds-uid", Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "imagepind", Command: command}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "imagepind", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
}

var otherTaint = corev1.Taint{Key: "example.com/dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}

// node is a Node with imagepin's condition (beside the kubelet's Ready) and taint as
// asked, and another taint after it.
func node(name string, withCondition, withTaint bool) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if withCondition {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: condition, Status: corev1.ConditionTrue, Reason: "AllSetsReady"})
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse})
	if withTaint {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: taint, Effect: corev1.TaintEffectNoSchedule})
	}
	n.Spec.Taints = append(n.Spec.Taints, otherTaint)
	return n
}

func config() Config {
	return Config{Namespace: ns, DaemonSet: "imagepind", Container: "imagepind", Command: uninstall, Ready: ready,
		Condition: condition, StartupTaint: taint, Timeout: 5 * time.Second, Poll: 10 * time.Millisecond, Log: logrus.New()}
}

// Every node's imagepind is put in uninstall mode and waited for; only then are
// imagepin's condition and startup taint removed from the Nodes, and nothing else of
// them: the kubelet's conditions and the other taints stay, in order.
func TestEveryNodeGivenBack(t *testing.T) {
	cs := fake.NewClientset(daemonSet(3),
		pod("imagepind-a", "node-0", normal, true), pod("imagepind-b", "node-1", normal, true), pod("imagepind-c", "node-2", normal, true),
		node("node-0", true, true), node("node-1", true, false), node("node-2", false, true), node("control-0", false, false))
	// The kubelet changed node-1's status between the read and the patch once: the
	// patch's test fails, the Node is read again.
	var raced atomic.Bool
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p := a.(k8stesting.PatchAction); p.GetName() == "node-1" && p.GetSubresource() == "status" && !raced.Swap(true) {
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "node-1", nil)
		}
		return false, nil, nil
	})
	ctx := context.Background()
	done := make(chan error, 1)
	var res Result
	go func() {
		var err error
		res, err = Run(ctx, cs, config())
		done <- err
	}()

	// The DaemonSet controller's part: once the template changed, each node's pod is
	// replaced by one in uninstall mode, ready once its node is given back.
	var ds *appsv1.DaemonSet
	waitFor(t, "the DaemonSet in uninstall mode", func() bool {
		ds, _ = cs.AppsV1().DaemonSets(ns).Get(ctx, "imagepind", metav1.GetOptions{})
		return slices.Equal(ds.Spec.Template.Spec.Containers[0].Command, uninstall)
	})
	c := ds.Spec.Template.Spec.Containers[0]
	if len(c.Args) != 0 || c.ReadinessProbe == nil || c.ReadinessProbe.Exec == nil || !slices.Equal(c.ReadinessProbe.Exec.Command, ready) {
		t.Fatalf("container in uninstall mode: args %q, readiness %+v", c.Args, c.ReadinessProbe)
	}
	if c.Image != "quay.io/imagepin/imagepin:0.1.0" || len(c.Env) != 1 || !ds.Spec.Template.Spec.HostNetwork {
		t.Fatalf("the rest of the pod changed: %+v", ds.Spec.Template.Spec)
	}
	if u := ds.Spec.UpdateStrategy.RollingUpdate; u == nil || u.MaxUnavailable.String() != "100%" {
		t.Fatalf("update strategy %+v: every node at once", ds.Spec.UpdateStrategy)
	}
	select {
	case err := <-done:
		t.Fatalf("returned before any node was given back: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	for i, old := range []string{"imagepind-a", "imagepind-b", "imagepind-c"} {
		if err := cs.CoreV1().Pods(ns).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		p := pod(old+"-u", "node-"+string(rune('0'+i)), uninstall, false)
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("returned while no node said it was given back: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if n, _ := cs.CoreV1().Nodes().Get(ctx, "node-0", metav1.GetOptions{}); len(n.Status.Conditions) != 3 {
		t.Fatal("a Node's condition removed before its node was given back")
	}
	for _, name := range []string{"imagepind-a-u", "imagepind-b-u", "imagepind-c-u"} {
		p, _ := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		p.Status.Conditions[0].Status = corev1.ConditionTrue
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return once every node was given back")
	}
	if res != (Result{Nodes: 3, Conditions: 2, Taints: 2}) {
		t.Errorf("result %+v", res)
	}
	if !raced.Load() {
		t.Error("the racing kubelet was never met")
	}
	nodes, _ := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	for _, n := range nodes.Items {
		var types []corev1.NodeConditionType
		for _, c := range n.Status.Conditions {
			types = append(types, c.Type)
		}
		if !slices.Equal(types, []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure}) {
			t.Errorf("%s: conditions %v", n.Name, types)
		}
		if !slices.Equal(n.Spec.Taints, []corev1.Taint{otherTaint}) {
			t.Errorf("%s: taints %v", n.Name, n.Spec.Taints)
		}
	}
}

// Nodes not given back within the timeout fail the whole and are named, each with why;
// no Node is changed (the next helm uninstall tries again).
func TestNodesNotGivenBackAreNamed(t *testing.T) {
	crashing := pod("imagepind-c-u", "node-2", uninstall, false)
	crashing.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s"}}
	ds := daemonSet(4)
	ds.Spec.Template.Spec.Containers[0].Command = uninstall // patched by an earlier run
	cs := fake.NewClientset(ds,
		pod("imagepind-a-u", "node-0", uninstall, true), pod("imagepind-b", "node-1", normal, true), crashing,
		node("node-0", true, true), node("node-1", true, true))
	cfg := config()
	cfg.Timeout = 300 * time.Millisecond
	_, err := Run(context.Background(), cs, cfg)
	var ng *NotGivenBack
	if !errors.As(err, &ng) {
		t.Fatalf("error %v, want NotGivenBack", err)
	}
	for _, want := range []string{
		"3 of 4 nodes not given back within 300ms:",
		"node-1 (pod imagepind-b: imagepind in its normal mode, not replaced yet)",
		"node-2 (pod imagepind-c-u: not started: CrashLoopBackOff: back-off 40s)",
		"1 without a pod of DaemonSet imagepind yet",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	for _, name := range []string{"node-0", "node-1"} {
		n, _ := cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if len(n.Status.Conditions) != 3 || len(n.Spec.Taints) != 2 {
			t.Errorf("%s changed though not every node was given back: %v %v", name, n.Status.Conditions, n.Spec.Taints)
		}
	}
	// A pod of another owner with the same labels counts for nothing.
	stray := pod("stray", "node-3", uninstall, true)
	stray.OwnerReferences = nil
	cs.CoreV1().Pods(ns).Create(context.Background(), stray, metav1.CreateOptions{})
	if _, err := Run(context.Background(), cs, cfg); !errors.As(err, &ng) || ng.NoPod != 1 {
		t.Errorf("with a stray pod: %v", err)
	}
}

// Without the DaemonSet (deleted by hand) nothing can give a node back: the Nodes'
// marks still go, and that is said.
func TestNoDaemonSet(t *testing.T) {
	cs := fake.NewClientset(node("node-0", true, true))
	res, err := Run(context.Background(), cs, config())
	if err != nil || res != (Result{Conditions: 1, Taints: 1}) {
		t.Fatalf("%+v, %v", res, err)
	}
	// A DaemonSet without imagepind's container is refused, naming it.
	ds := daemonSet(1)
	ds.Spec.Template.Spec.Containers[0].Name = "other"
	if _, err := Run(context.Background(), fake.NewClientset(ds), config()); err == nil || !strings.Contains(err.Error(), "has no container imagepind") {
		t.Fatalf("a DaemonSet without the container: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ptr[T any](v T) *T { return &v }
