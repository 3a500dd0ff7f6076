//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/cluster/starttaint"
	"github.com/imagepin/imagepin/nodecondition"
	"github.com/imagepin/imagepin/status"
)

var otherTaint = corev1.Taint{Key: "example.com/other", Value: "kept", Effect: corev1.TaintEffectNoSchedule}

// registerLikeKubelet makes the Node look as the kubelet leaves it at registration with
// registerWithTaints: the startup taint (and another), and its own conditions.
func (c *cluster) registerLikeKubelet(name string) []corev1.NodeCondition {
	c.t.Helper()
	ctx := c.t.Context()
	n, err := c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: starttaint.DefaultKey, Effect: corev1.TaintEffectNoSchedule}, otherTaint}
	if n, err = c.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	hb := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available", LastHeartbeatTime: hb, LastTransitionTime: hb},
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: hb, LastTransitionTime: hb},
	}
	if _, err = c.cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	return n.Status.Conditions
}

func (c *cluster) node(name string) *corev1.Node {
	c.t.Helper()
	n, err := c.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

func nodeCondition(n *corev1.Node, t string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// events are the Events about an object, as `kubectl describe` lists them.
func (c *cluster) events(kind, name string) []corev1.Event {
	c.t.Helper()
	l, err := c.cs.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.String()})
	if err != nil {
		c.t.Fatal(err)
	}
	return l.Items
}

func findEvent(evs []corev1.Event, reason string) *corev1.Event {
	for i := range evs {
		if evs[i].Reason == reason {
			return &evs[i]
		}
	}
	return nil
}

// applyNodePolicy creates the ValidatingAdmissionPolicy and its binding as shipped.
func (c *cluster) applyNodePolicy() {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "packaging", "aggregator", "nodepolicy.yaml"))
	if err != nil {
		c.t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			c.t.Fatal(err)
		}
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			c.t.Fatal(err)
		}
		api := c.cs.AdmissionregistrationV1()
		switch kind.Kind {
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			if err = yaml.UnmarshalStrict(doc, &p); err == nil {
				_, err = api.ValidatingAdmissionPolicies().Create(c.t.Context(), &p, metav1.CreateOptions{})
			}
		case "ValidatingAdmissionPolicyBinding":
			var p admissionv1.ValidatingAdmissionPolicyBinding
			if err = yaml.UnmarshalStrict(doc, &p); err == nil {
				_, err = api.ValidatingAdmissionPolicyBindings().Create(c.t.Context(), &p, metav1.CreateOptions{})
			}
		case "":
			continue
		default:
			err = fmt.Errorf("unexpected kind %q", kind.Kind)
		}
		if err != nil {
			c.t.Fatalf("nodepolicy.yaml: %v", err)
		}
	}
}

// The shipped policy narrows the aggregator's "patch" on nodes: with its identity, every
// change of a Node but the startup taint's removal is refused by the API server itself
// (an owner that does not exist would have the garbage collector delete the Node), and
// the removal goes through.
func (c *cluster) requireNodePolicy() {
	c.t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", c.aggConfig)
	if err != nil {
		c.t.Fatal(err)
	}
	agg := kubernetes.NewForConfigOrDie(rc)
	c.createNode("probe", nil)
	ctx := c.t.Context()
	n := c.node("probe")
	n.Spec.Taints = []corev1.Taint{{Key: starttaint.DefaultKey, Effect: corev1.TaintEffectNoSchedule}, otherTaint}
	if _, err := c.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	i := 0
	var last error
	waitUntil(c.t, "the node policy in force", 30*time.Second, func() bool {
		i++
		_, last = agg.CoreV1().Nodes().Patch(ctx, "probe", types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{"try":"%d"}}}`, i), metav1.PatchOptions{})
		return last != nil && strings.Contains(last.Error(), "may not change a Node's metadata")
	})
	c.t.Logf("the aggregator's identity labelling a Node: %v", last)
	refused := []struct{ what, patch, want string }{
		{"an owner", `[{"op":"add","path":"/metadata/ownerReferences","value":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000001"}]}]`, "may not change a Node's metadata"},
		{"a finalizer", `[{"op":"add","path":"/metadata/finalizers","value":["example.com/hold"]}]`, "may not change a Node's metadata"},
		{"an annotation", `[{"op":"add","path":"/metadata/annotations","value":{"a":"b"}}]`, "may not change a Node's metadata"},
		{"providerID", `[{"op":"add","path":"/spec/providerID","value":"e2e://other"}]`, "may change nothing of a Node's spec"},
		{"podCIDR", `[{"op":"add","path":"/spec/podCIDR","value":"10.244.9.0/24"}]`, "may change nothing of a Node's spec"},
		{"cordon", `[{"op":"add","path":"/spec/unschedulable","value":true}]`, "may change nothing of a Node's spec"},
		{"another taint removed", `[{"op":"remove","path":"/spec/taints/1"}]`, "change no other taint"},
		{"a taint added", `[{"op":"add","path":"/spec/taints/-","value":{"key":"x","effect":"NoSchedule"}}]`, "change no other taint"},
	}
	for _, r := range refused {
		_, err := agg.CoreV1().Nodes().Patch(ctx, "probe", types.JSONPatchType, []byte(r.patch), metav1.PatchOptions{})
		if err == nil || !strings.Contains(err.Error(), r.want) {
			c.t.Fatalf("the aggregator's identity patching a Node (%s): %v, want refused with %q", r.what, err, r.want)
		}
	}
	// Its status: RBAC grants no subresource (the policy would refuse it too).
	if _, err := agg.CoreV1().Nodes().Patch(ctx, "probe", types.MergePatchType, []byte(`{"metadata":{"labels":{"via":"status"}}}`), metav1.PatchOptions{}, "status"); err == nil {
		c.t.Fatal("the aggregator's identity patched a Node's status")
	}
	// The removal, as the aggregator makes it: the other taint and everything else stay.
	_, err = agg.CoreV1().Nodes().Patch(ctx, "probe", types.JSONPatchType, []byte(`[{"op":"remove","path":"/spec/taints/0"}]`), metav1.PatchOptions{FieldManager: "imagepin-aggregator"})
	if err != nil {
		c.t.Fatalf("the aggregator's identity removing the startup taint: %v", err)
	}
	n = c.node("probe")
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != otherTaint || n.Spec.ProviderID != "" || n.Spec.PodCIDR != "" || len(n.OwnerReferences) != 0 || len(n.Finalizers) != 0 || n.Labels["via"] != "" {
		c.t.Fatalf("the probe Node after the refusals and the removal: %+v", n)
	}
	c.deleteNode("probe")
}

// A node that registers with the startup taint is held back until its sets are in:
// imagepind, with the node's own certificate (Node authorizer, NodeRestriction), says
// PinnedImagesReady False while a set cannot be pulled and True once it is Ready,
// beside the kubelet's untouched conditions; the aggregator's leader then removes the
// startup taint (and no other), once: the condition turning False later, during an API
// outage, is written when the API is back and puts nothing back. The aggregator does it
// under the shipped policy that allows it nothing else on a Node. Events on the Node and
// the set tell the story.
func TestNodeConditionLiftsStartupTaint(t *testing.T) {
	c := newCluster(t)
	kubelets := c.registerLikeKubelet(nodeName)
	c.applyNodePolicy()
	c.requireNodePolicy()
	agg := c.startClusterAggregator("aggregator", "--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms")

	good := c.push("nc-good", 2)
	gone := c.reg.Host + "/nodecond/gone@sha256:" + strings.Repeat("ab", 32)
	c.applyYAML(apiSet("boot", `{matchLabels: {node-role.kubernetes.io/worker: ""}}`, append([]string{gone}, good...)...))
	c.startNode("", agg.grpcAddr)

	// An image that cannot be pulled: False, SetsDegraded, naming the set; the taint stays.
	waitUntil(t, "PinnedImagesReady False (SetsDegraded)", 90*time.Second, func() bool {
		cond := nodeCondition(c.node(nodeName), nodecondition.Type)
		return cond != nil && cond.Status == corev1.ConditionFalse && cond.Reason == nodecondition.ReasonSetsDegraded
	})
	n := c.node(nodeName)
	cond := nodeCondition(n, nodecondition.Type)
	t.Logf("node condition: %s %s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	if !strings.Contains(cond.Message, "boot") {
		t.Fatalf("the message does not name the set: %q", cond.Message)
	}
	time.Sleep(3 * time.Second)
	if !hasTaint(c.node(nodeName), starttaint.DefaultKey) {
		t.Fatal("the startup taint went while the node's sets were not Ready")
	}

	// The set fixed: Ready on the node, the condition True, then the taint gone. Never the
	// taint gone while the condition is not True.
	u, err := c.sets().Get(t.Context(), "boot", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["spec"].(map[string]any)["pinnedImages"] = []any{map[string]any{"name": good[0]}, map[string]any{"name": good[1]}}
	if _, err := c.sets().Update(t.Context(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var trueAt, removedAt time.Time
	start := time.Now()
	waitUntil(t, "the startup taint removed", 90*time.Second, func() bool {
		n := c.node(nodeName)
		cond := nodeCondition(n, nodecondition.Type)
		if cond != nil && cond.Status == corev1.ConditionTrue && trueAt.IsZero() {
			trueAt = time.Now()
		}
		if !hasTaint(n, starttaint.DefaultKey) {
			if cond == nil || cond.Status != corev1.ConditionTrue {
				t.Fatalf("the taint went with the condition %+v", cond)
			}
			removedAt = time.Now()
			return true
		}
		return false
	})
	t.Logf("set updated → condition True in %s, taint removed %s later",
		trueAt.Sub(start).Round(100*time.Millisecond), removedAt.Sub(trueAt).Round(100*time.Millisecond))
	c.requirePinned(good...)

	n = c.node(nodeName)
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != otherTaint {
		t.Fatalf("taints after the removal: %+v", n.Spec.Taints)
	}
	// The kubelet's conditions are exactly as it wrote them.
	for _, k := range kubelets {
		got := nodeCondition(n, string(k.Type))
		if got == nil || got.Status != k.Status || got.Reason != k.Reason || got.Message != k.Message || !got.LastHeartbeatTime.Equal(&k.LastHeartbeatTime) {
			t.Fatalf("the kubelet's %s condition changed: %+v", k.Type, got)
		}
	}
	cond = nodeCondition(n, nodecondition.Type)
	if cond.Reason != nodecondition.ReasonAllSetsReady || !strings.Contains(cond.Message, "boot") {
		t.Fatalf("condition %+v", cond)
	}

	// The Events: the node's own (imagepind) and the aggregator's.
	waitUntil(t, "the Events on the Node", 30*time.Second, func() bool {
		evs := c.events("Node", nodeName)
		return findEvent(evs, nodecondition.EventReady) != nil && findEvent(evs, nodecondition.EventNotReady) != nil && findEvent(evs, starttaint.EventRemoved) != nil
	})
	evs := c.events("Node", nodeName)
	for _, want := range []struct{ reason, component string }{
		{nodecondition.EventNotReady, "imagepind"}, {nodecondition.EventReady, "imagepind"}, {starttaint.EventRemoved, "imagepin-aggregator"},
	} {
		e := findEvent(evs, want.reason)
		if e.Source.Component != want.component {
			t.Fatalf("event %s from %q", want.reason, e.Source.Component)
		}
		t.Logf("Node event: %s %s (%s): %s", e.Type, e.Reason, e.Source.Component, e.Message)
	}
	waitUntil(t, "the Events on the set", 30*time.Second, func() bool {
		evs := c.events("PinnedImageSet", "boot")
		return findEvent(evs, "SetReady") != nil && findEvent(evs, "SetDegraded") != nil
	})
	for _, e := range c.events("PinnedImageSet", "boot") {
		t.Logf("PinnedImageSet event: %s %s: %s", e.Type, e.Reason, e.Message)
	}

	// The API gone while a set fails on the node (a local set file): imagepind keeps the
	// latest condition and writes it when the API answers again. Bootstrap only: the
	// condition False puts no taint back.
	c.kube.StopAPIServer()
	c.writeSet("local.yaml", alphaSet("local", gone))
	c.waitFor("the local set Failed", 90*time.Second, phaseIs("local", status.Failed))
	time.Sleep(3 * time.Second)
	restart := time.Now()
	if err := c.kube.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "PinnedImagesReady False after the outage", 90*time.Second, func() bool {
		cond := nodeCondition(c.node(nodeName), nodecondition.Type)
		return cond != nil && cond.Status == corev1.ConditionFalse && cond.Reason == nodecondition.ReasonSetsDegraded && strings.Contains(cond.Message, "local")
	})
	t.Logf("the condition written %s after the API server's start began", time.Since(restart).Round(100*time.Millisecond))
	waitUntil(t, "a warning Event", 30*time.Second, func() bool {
		for _, e := range c.events("Node", nodeName) {
			if e.Reason == nodecondition.EventNotReady && e.Type == corev1.EventTypeWarning {
				return true
			}
		}
		return false
	})
	time.Sleep(3 * time.Second)
	if n := c.node(nodeName); hasTaint(n, starttaint.DefaultKey) || len(n.Spec.Taints) != 1 {
		t.Fatalf("taints after the condition went False: %+v", n.Spec.Taints)
	}
}
