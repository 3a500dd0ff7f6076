package manifests_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/initializer"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const (
	aggregatorUser = "system:serviceaccount:imagepin:imagepin-aggregator"
	startupKey     = "imagepin.io/images-not-ready"
)

// nodePolicy is the API server's own ValidatingAdmissionPolicy plugin (the code
// kube-apiserver runs: its CEL environment, cost limits, matching and bindings) loaded
// with nodepolicy.yaml as shipped. It returns the admission of an update of a Node (or
// of one of its subresources) by a user.
func nodePolicy(t *testing.T) func(was, now *corev1.Node, username, subresource string) error {
	t.Helper()
	b, err := os.ReadFile("nodepolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			t.Fatal(err)
		}
		switch kind.Kind {
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
				t.Fatalf("nodepolicy.yaml: %v", err)
			}
			// The defaults the API server gives a policy it stores.
			mc := p.Spec.MatchConstraints
			mc.NamespaceSelector, mc.ObjectSelector = &metav1.LabelSelector{}, &metav1.LabelSelector{}
			eq := admissionv1.Equivalent
			mc.MatchPolicy = &eq
			for i := range mc.ResourceRules {
				if mc.ResourceRules[i].Scope == nil {
					all := admissionv1.AllScopes
					mc.ResourceRules[i].Scope = &all
				}
			}
			objs = append(objs, &p)
		case "ValidatingAdmissionPolicyBinding":
			var p admissionv1.ValidatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
				t.Fatalf("nodepolicy.yaml: %v", err)
			}
			objs = append(objs, &p)
		default:
			t.Fatalf("nodepolicy.yaml: unexpected kind %q", kind.Kind)
		}
	}
	if len(objs) != 2 {
		t.Fatalf("nodepolicy.yaml: %d objects, want a policy and its binding", len(objs))
	}

	cs := fake.NewClientset(objs...)
	informer := informers.NewSharedInformerFactory(cs, 0)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	plugin := validating.NewPlugin(nil)
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Node"), meta.RESTScopeRoot)
	// No feature gates: the validating plugin reads the process's own (the API server's defaults).
	initializer.New(cs, dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), informer, allowAll{},
		nil, stop, mapper).Initialize(plugin)
	if err := plugin.ValidateInitialization(); err != nil {
		t.Fatal(err)
	}
	informer.Start(stop)
	deadline := time.Now().Add(10 * time.Second)
	for !plugin.WaitForReady() {
		if time.Now().After(deadline) {
			t.Fatal("the policy plugin never became ready")
		}
	}

	nodes := corev1.SchemeGroupVersion.WithResource("nodes")
	kind := corev1.SchemeGroupVersion.WithKind("Node")
	return func(was, now *corev1.Node, username, subresource string) error {
		attr := admission.NewAttributesRecord(now, was, kind, "", now.Name, nodes, subresource,
			admission.Update, &metav1.UpdateOptions{}, false, &user.DefaultInfo{Name: username})
		return plugin.Validate(context.Background(), attr, admission.NewObjectInterfacesFromScheme(scheme.Scheme))
	}
}

type allowAll struct{}

func (allowAll) Authorize(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	return authorizer.DecisionAllow, "", nil
}

var otherTaint = corev1.Taint{Key: "example.com/other", Value: "kept", Effect: corev1.TaintEffectNoSchedule}

// registered is a Node as the kubelet and the controllers leave it: the startup taint
// first, another taint after it.
func registered() *corev1.Node {
	hb := metav1.NewTime(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "worker-1", UID: "0b5c4a5e-1111-2222-3333-444455556666", ResourceVersion: "41",
			CreationTimestamp: hb,
			Labels:            map[string]string{"kubernetes.io/hostname": "worker-1", "node-role.kubernetes.io/worker": ""},
			Annotations:       map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &hb}},
		},
		Spec: corev1.NodeSpec{
			PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}, ProviderID: "aws:///eu-west-1a/i-0abc",
			Taints: []corev1.Taint{{Key: startupKey, Effect: corev1.TaintEffectNoSchedule}, otherTaint},
		},
		Status: corev1.NodeStatus{
			Capacity:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: hb, LastTransitionTime: hb}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}},
		},
	}
}

// unassigned is a registered Node the cloud and IPAM controllers have not got to yet.
func unassigned() *corev1.Node {
	n := registered()
	n.Spec.ProviderID, n.Spec.PodCIDR, n.Spec.PodCIDRs = "", "", nil
	return n
}

// lifted is the Node after the aggregator's JSON patch: the startup taint gone, and what
// the API server writes itself changed.
func lifted(was *corev1.Node) *corev1.Node {
	n := was.DeepCopy()
	var kept []corev1.Taint
	for _, t := range n.Spec.Taints {
		if t.Key != startupKey {
			kept = append(kept, t)
		}
	}
	n.Spec.Taints = kept
	n.ResourceVersion = "42"
	n.Generation++
	n.ManagedFields = append(n.ManagedFields, metav1.ManagedFieldsEntry{Manager: "imagepin-aggregator", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1"})
	return n
}

// big is a Node far past what clusters have: many labels, taints, images and volumes,
// to show that the policy stays within the API server's CEL cost limits.
func big() *corev1.Node {
	n := registered()
	for i := range 500 {
		n.Labels[fmt.Sprintf("example.com/label-%d", i)] = strings.Repeat("v", 63)
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: fmt.Sprintf("example.com/taint-%d", i), Value: "x", Effect: corev1.TaintEffectNoSchedule})
		n.Status.VolumesAttached = append(n.Status.VolumesAttached, corev1.AttachedVolume{Name: corev1.UniqueVolumeName(fmt.Sprintf("kubernetes.io/csi/ebs^vol-%d", i)), DevicePath: "/dev/xvdba"})
	}
	n.Annotations["example.com/big"] = strings.Repeat("a", 200_000)
	for i := range 100 {
		var names []string
		for j := range 20 {
			names = append(names, fmt.Sprintf("registry.example.com/team/app-%d@sha256:%064d", i, j))
		}
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: names, SizeBytes: 1 << 30})
	}
	return n
}

// The shipped node policy allows the aggregator's service account one change of a Node:
// taints with the startup taint's key removed. Every other change is refused, whichever
// part of the Node it touches (each part the policy compares once, by every refusal
// message); other users are not its business.
func TestNodePolicyAllowsOnlyTheStartupTaintsRemoval(t *testing.T) {
	admit := nodePolicy(t)
	const (
		taints   = "change no other taint"
		spec     = "may change nothing of a Node's spec"
		metadata = "may not change a Node's metadata"
		status   = "may not change a Node's status"
	)
	cases := []struct {
		name   string
		was    func() *corev1.Node
		change func(n *corev1.Node) // applied after the startup taint's removal
		user   string
		sub    string
		refuse string // "": allowed
	}{
		{name: "the startup taint removed"},
		{name: "the startup taint removed from a Node far past real sizes", was: big},
		{name: "nothing changed", change: func(n *corev1.Node) { n.Spec.Taints = registered().Spec.Taints }},
		{name: "the startup taint with two effects, both removed", was: func() *corev1.Node {
			n := registered()
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: startupKey, Effect: corev1.TaintEffectNoExecute})
			return n
		}},
		{name: "another user labels the Node", user: "system:node:worker-1", change: func(n *corev1.Node) { n.Labels["x"] = "y" }},

		{name: "ownerReferences added", refuse: metadata, change: func(n *corev1.Node) {
			n.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "00000000-0000-0000-0000-000000000001"}}
		}},
		{name: "a finalizer added", refuse: metadata, change: func(n *corev1.Node) { n.Finalizers = []string{"example.com/hold"} }},
		{name: "a label added", refuse: metadata, change: func(n *corev1.Node) { n.Labels["try"] = "1" }},
		{name: "a label changed", refuse: metadata, change: func(n *corev1.Node) { n.Labels["kubernetes.io/hostname"] = "other" }},
		{name: "the labels dropped", refuse: metadata, change: func(n *corev1.Node) { n.Labels = nil }},
		{name: "an annotation added", refuse: metadata, change: func(n *corev1.Node) { n.Annotations["a"] = "b" }},
		{name: "the annotations dropped", refuse: metadata, change: func(n *corev1.Node) { n.Annotations = nil }},
		// providerID and podCIDR: the API server's own validation lets them change only
		// from "", and so does anyone who may update the Node, but for this policy.
		{name: "providerID set", refuse: spec, was: unassigned, change: func(n *corev1.Node) { n.Spec.ProviderID = "aws:///eu-west-1a/i-0def" }},
		{name: "podCIDR set", refuse: spec, was: unassigned, change: func(n *corev1.Node) {
			n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.9.0/24", []string{"10.244.9.0/24"}
		}},
		{name: "cordoned", refuse: spec, change: func(n *corev1.Node) { n.Spec.Unschedulable = true }},
		{name: "uncordoned", refuse: spec, was: func() *corev1.Node {
			n := registered()
			n.Spec.Unschedulable = true
			return n
		}, change: func(n *corev1.Node) { n.Spec.Unschedulable = false }},
		{name: "another taint removed", refuse: taints, change: func(n *corev1.Node) { n.Spec.Taints = nil }},
		{name: "another taint added", refuse: taints, change: func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "x", Effect: corev1.TaintEffectNoSchedule})
		}},
		{name: "another taint changed", refuse: taints, change: func(n *corev1.Node) { n.Spec.Taints[0].Value = "changed" }},
		{name: "the startup taint added", refuse: taints, was: func() *corev1.Node {
			n := registered()
			n.Spec.Taints = []corev1.Taint{otherTaint}
			return n
		}, change: func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: startupKey, Effect: corev1.TaintEffectNoSchedule})
		}},
		{name: "the startup taint's effect changed", refuse: taints, change: func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: startupKey, Effect: corev1.TaintEffectNoExecute})
		}},
		{name: "taints reordered", refuse: taints, was: func() *corev1.Node {
			n := registered()
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "example.com/third", Effect: corev1.TaintEffectNoSchedule})
			return n
		}, change: func(n *corev1.Node) { n.Spec.Taints[0], n.Spec.Taints[1] = n.Spec.Taints[1], n.Spec.Taints[0] }},
		{name: "a condition written through nodes/status", sub: "status", refuse: status, change: func(n *corev1.Node) {
			n.Spec.Taints = registered().Spec.Taints // the status strategy keeps the spec
			n.Status.Conditions[0].Status = corev1.ConditionFalse
		}},
		{name: "ownerReferences added through nodes/status", sub: "status", refuse: metadata, change: func(n *corev1.Node) {
			n.Spec.Taints = registered().Spec.Taints
			n.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "gone", UID: "00000000-0000-0000-0000-000000000001"}}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			was := registered
			if c.was != nil {
				was = c.was
			}
			old := was()
			now := lifted(old)
			if c.change != nil {
				c.change(now)
			}
			if c.user == "" {
				c.user = aggregatorUser
			}
			err := admit(old, now, c.user, c.sub)
			switch {
			case c.refuse == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.refuse != "" && err == nil:
				t.Fatalf("allowed, want refused with %q", c.refuse)
			case c.refuse != "" && !strings.Contains(err.Error(), c.refuse):
				t.Fatalf("refused with %v, want %q", err, c.refuse)
			}
		})
	}
}
