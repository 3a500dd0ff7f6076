package clusterstatus

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/imagepin/imagepin/api/readv1"
	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/status"
)

func cond(t *testing.T, st v1alpha1.Status, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(st.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, st.Conditions)
	}
	return *c
}

func TestBuildStatus(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	eta := 42.0
	for _, c := range []struct {
		name                         string
		view                         aggregator.SetView
		invalid                      string
		ready, progressing, degraded metav1.ConditionStatus
		readyReason, degradedReason  string
		nodes, progress              string
		failing                      []string
	}{
		{name: "all ready", view: aggregator.SetView{Ready: true, Targeted: 3, ReadyNodes: 3, BytesTotal: 30, BytesReady: 30},
			ready: "True", progressing: "False", degraded: "False", readyReason: ReasonAllNodesReady, nodes: "3/3", progress: "100%"},
		{name: "no node", view: aggregator.SetView{},
			ready: "False", progressing: "False", degraded: "False", readyReason: ReasonNoNodesTargeted, nodes: "0/0", progress: ""},
		{name: "invalid", view: aggregator.SetView{}, invalid: "spec.pinnedImages[0]: not by digest",
			ready: "False", progressing: "False", degraded: "True", readyReason: ReasonInvalidSpec, degradedReason: ReasonInvalidSpec, nodes: "0/0"},
		{name: "a node failed, one never reported, one pulling",
			view: aggregator.SetView{Targeted: 4, ReadyNodes: 1, FailedNodes: 1, UnknownNodes: 1, ProgressingNodes: 1, BytesTotal: 300, BytesReady: 150, ETASeconds: &eta,
				Nodes: []aggregator.SetNode{
					{Node: "b", Phase: "Pulling", Reason: "Pulling"},
					{Node: "c", Phase: aggregator.PhaseUnknown, Reason: aggregator.ReasonNeverReported, Message: "never"},
					{Node: "d", Phase: "Failed", Reason: "InsufficientDiskSpace", Message: "needs 2 GiB"},
				}},
			ready: "False", progressing: "True", degraded: "True", readyReason: ReasonNodesFailed, degradedReason: "InsufficientDiskSpace",
			nodes: "1/4", progress: "37%", failing: []string{"d", "c"}},
		// A node that reports but has not picked the set up yet is not degraded: that is
		// the normal second after an apply.
		{name: "not received yet",
			view: aggregator.SetView{Targeted: 2, ReadyNodes: 1, UnknownNodes: 1,
				Nodes: []aggregator.SetNode{{Node: "b", Phase: aggregator.PhaseUnknown, Reason: aggregator.ReasonNotReceived}}},
			ready: "False", progressing: "False", degraded: "False", readyReason: ReasonNodesUnknown, nodes: "1/2", progress: "0%", failing: []string{"b"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := BuildStatus(7, c.view, c.invalid, nil, now)
			if st.ObservedGeneration != 7 || st.Nodes != c.nodes || st.Progress != c.progress {
				t.Errorf("generation %d nodes %q progress %q", st.ObservedGeneration, st.Nodes, st.Progress)
			}
			r, p, d := cond(t, st, "Ready"), cond(t, st, "Progressing"), cond(t, st, "Degraded")
			if r.Status != c.ready || p.Status != c.progressing || d.Status != c.degraded || r.Reason != c.readyReason {
				t.Errorf("Ready %s/%s Progressing %s Degraded %s", r.Status, r.Reason, p.Status, d.Status)
			}
			if c.degradedReason != "" && d.Reason != c.degradedReason {
				t.Errorf("Degraded reason %s, want %s", d.Reason, c.degradedReason)
			}
			var failing []string
			for _, n := range st.FailingNodes {
				failing = append(failing, n.Node)
			}
			if strings.Join(failing, ",") != strings.Join(c.failing, ",") {
				t.Errorf("failing nodes %v, want %v", failing, c.failing)
			}
			if c.degraded == "True" && c.invalid == "" && !strings.Contains(d.Message, "d: InsufficientDiskSpace: needs 2 GiB") {
				t.Errorf("Degraded message does not name the node and why: %s", d.Message)
			}
		})
	}
}

// Transition times move only when a condition's status does; the ETA is rounded so a
// moving estimate does not make every rollup a new status.
func TestBuildStatusStable(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	eta1, eta2 := 101.0, 103.0
	v := aggregator.SetView{Targeted: 1, ProgressingNodes: 1, ETASeconds: &eta1, Nodes: []aggregator.SetNode{{Node: "a", Phase: "Pulling"}}}
	first := BuildStatus(1, v, "", nil, t0)
	v.ETASeconds = &eta2
	second := BuildStatus(1, v, "", first.Conditions, t0.Add(time.Minute))
	if *first.ETASeconds != 110 || *second.ETASeconds != 110 {
		t.Fatalf("eta %d %d", *first.ETASeconds, *second.ETASeconds)
	}
	if !cond(t, second, "Ready").LastTransitionTime.Time.Equal(t0) {
		t.Fatal("Ready's transition time moved without a transition")
	}
	v = aggregator.SetView{Ready: true, Targeted: 1, ReadyNodes: 1}
	third := BuildStatus(1, v, "", second.Conditions, t0.Add(2*time.Minute))
	if !cond(t, third, "Ready").LastTransitionTime.Time.Equal(t0.Add(2 * time.Minute)) {
		t.Fatal("Ready's transition time did not move on a transition")
	}
}

// The rollup of a name clash (FileError on the node) makes the set Degraded and not
// Progressing: an administrator must rename one of the two sets.
func TestBuildStatusNameClashIsDegraded(t *testing.T) {
	v := aggregator.SetView{Name: "foo", Targeted: 1, UnknownNodes: 1, Nodes: []aggregator.SetNode{{Node: "w1",
		Phase: aggregator.PhaseUnknown, Reason: aggregator.ReasonFileError, Message: `set "foo" is already defined in z-foo.yaml`}}}
	st := BuildStatus(1, v, "", nil, time.Now())
	cond := map[string]metav1.Condition{}
	for _, c := range st.Conditions {
		cond[c.Type] = c
	}
	if cond[v1alpha1.ConditionDegraded].Status != metav1.ConditionTrue || cond[v1alpha1.ConditionProgressing].Status != metav1.ConditionFalse ||
		!strings.Contains(cond[v1alpha1.ConditionDegraded].Message, "z-foo.yaml") {
		t.Fatalf("conditions %+v", st.Conditions)
	}
}

// The set's RegistryIndependent, from what its nodes report (their RegistryIndependent
// and its node-local part, PodsStartWithoutRegistry) and the aggregator's count of the
// holders of every blob of the set's images: the nodes where pods would pull when they
// start, the nodes not Ready, and the blobs held by too few nodes for a node to join
// are said apart, and a node whose own pods start is never said to need the registry
// when a pod starts.
func TestBuildStatusRegistryIndependent(t *testing.T) {
	held := status.BlobHolders{Status: status.True, Images: 2, Blobs: 9}
	short := status.BlobHolders{Status: status.False, Images: 2, Blobs: 9, ShortCount: 1, Short: []status.ShortBlob{
		{Digest: "sha256:" + strings.Repeat("3", 64), Image: "reg.example/a@sha256:" + strings.Repeat("a", 64), Size: 1 << 20, Holders: []string{"w1"}, Pinners: 2}}}
	shortWhy := "1 of the 9 blobs of the images are held by fewer than 2 nodes (with the registry gone, a node joining or replacing one gets every blob from its peers): sha256:" +
		strings.Repeat("3", 64) + " (1.0 MiB, of reg.example/a@sha256:" + strings.Repeat("a", 64) + ") is held by w1 only: a node replacing w1 would fail, and any node joining once w1 is gone"
	cond := func(typ, st, reason, msg string) *status.Condition {
		return &status.Condition{Type: typ, Status: st, Reason: reason, Message: msg}
	}
	independent := cond(status.ConditionRegistryIndependent, status.True, status.ReasonPodsStartWithoutRegistry, "")
	ownStart := cond(status.ConditionPodsStartWithoutRegistry, status.True, status.ReasonImagesHeld, "")
	stranded := cond(status.ConditionRegistryIndependent, status.False, status.ReasonBlobsNotHeld, shortWhy+"; this node's own pods start")
	uncounted := cond(status.ConditionRegistryIndependent, status.Unknown, status.ReasonBlobHoldersUnknown, "cannot be told")
	verifies := cond(status.ConditionPodsStartWithoutRegistry, status.False, status.ReasonCredentialVerification, "imagePullCredentialsVerificationPolicy AlwaysVerify: 3 of 3 images need the registry")
	unsure := cond(status.ConditionPodsStartWithoutRegistry, status.Unknown, status.ReasonCredentialVerification, "whether KubeletEnsureSecretPulledImages is on cannot be told")
	type node struct {
		name     string
		phase    status.Phase
		ri, own  *status.Condition
		reported bool // false: Unknown, never AddRegistry'd
	}
	ready := func(name string, ri, own *status.Condition) node { return node{name, status.Ready, ri, own, true} }
	view := func(holders status.BlobHolders, nodes ...node) aggregator.SetView {
		v := aggregator.SetView{Targeted: len(nodes), BlobHolders: holders}
		for _, n := range nodes {
			switch {
			case !n.reported:
				v.UnknownNodes++
				continue
			case n.phase == status.Ready:
				v.ReadyNodes++
			default:
				v.ProgressingNodes++
			}
			v.AddRegistry(n.name, n.phase, n.ri, n.own)
		}
		v.Ready = v.ReadyNodes == v.Targeted
		v.FinishRegistry()
		return v
	}
	cases := []struct {
		name   string
		v      aggregator.SetView
		status metav1.ConditionStatus
		reason string
		msg    string
		not    string // never in the message
	}{
		{"every node says so, every blob held twice", view(held, ready("w1", independent, ownStart), ready("w2", independent, ownStart)),
			metav1.ConditionTrue, ReasonPodsStartWithoutRegistry, "on all 2 nodes, pods start from these images with the registry gone; each of the 9 blobs of the images is held by 2 nodes or more", ""},
		// The aggregator's count is the one that counts: a node that has not had it yet
		// does not hold the set back.
		{"every node's own pods start, the aggregator counts every blob twice", view(held, ready("w1", uncounted, ownStart), ready("w2", independent, ownStart)),
			metav1.ConditionTrue, ReasonPodsStartWithoutRegistry, "on all 2 nodes", ""},
		{"every node's own pods start, a blob held by one node", view(short, ready("w1", stranded, ownStart), ready("w2", stranded, ownStart)),
			metav1.ConditionFalse, status.ReasonBlobsNotHeld,
			"on all 2 nodes, pods start from these images with the registry gone, but a node joining or replacing one would need the registry: " + shortWhy, "when a pod starts"},
		{"every node's own pods start, the holders not counted", view(status.HoldersUnknown("the aggregator started less than 1m0s ago"), ready("w1", uncounted, ownStart), ready("w2", uncounted, ownStart)),
			metav1.ConditionFalse, status.ReasonBlobHoldersUnknown,
			"on all 2 nodes, pods start from these images with the registry gone, but whether a node joining or replacing one would need the registry cannot be told: whether every blob of the images is held by 2 nodes cannot be told: the aggregator started less than 1m0s ago",
			"when a pod starts"},
		{"a node's kubelet verifies", view(held, ready("w1", independent, ownStart),
			ready("w2", cond(status.ConditionRegistryIndependent, status.False, status.ReasonCredentialVerification, verifies.Message), verifies)),
			metav1.ConditionFalse, status.ReasonCredentialVerification,
			"1 of 2 Ready nodes would need the registry when a pod starts: w2: CredentialVerification: imagePullCredentialsVerificationPolicy AlwaysVerify", "on all"},
		// The node's whole says BlobsNotHeld (a sure False) before its unsure kubelet:
		// its node-local part tells, and both are said.
		{"a node's kubelet unsure behind blobs held by one node", view(short, ready("w1", stranded, ownStart), ready("w2", stranded, unsure)),
			metav1.ConditionFalse, status.ReasonCredentialVerification,
			"1 of 2 Ready nodes would need the registry when a pod starts: w2: CredentialVerification: whether KubeletEnsureSecretPulledImages is on cannot be told; " +
				"a node joining or replacing one would need the registry: " + shortWhy, "w1:"},
		// A node that has never reported (a ghost): not Ready, and the Ready node's own
		// pods start; its blobs too few nodes hold.
		{"a node not Ready, the Ready one's blobs held by one node", view(short, ready("w1", stranded, ownStart), node{name: "ghost"}),
			metav1.ConditionFalse, ReasonNotAllNodesReady,
			"1/2 nodes ready: a node without every image present and pinned needs the registry; a node joining or replacing one would need the registry: " + shortWhy, "when a pod starts"},
		// An imagepind that does not say whether its own pods start: not assumed.
		{"a node that does not report its own pods' start", view(short, ready("w1", stranded, nil), ready("w2", stranded, ownStart)),
			metav1.ConditionFalse, readv1.ReasonNotReported,
			"1 of 2 Ready nodes would need the registry when a pod starts: w1: NotReported: the node does not report whether its own pods start without the registry (imagepind older than this aggregator); its RegistryIndependent: BlobsNotHeld: ",
			""},
		{"nodes still pulling", view(held, ready("w1", independent, ownStart), node{"w2", status.Pulling, nil, nil, true}),
			metav1.ConditionFalse, ReasonNotAllNodesReady, "1/2 nodes ready", "when a pod starts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := BuildStatus(1, c.v, "", nil, time.Now())
			var got *metav1.Condition
			for i := range st.Conditions {
				if st.Conditions[i].Type == v1alpha1.ConditionRegistryIndependent {
					got = &st.Conditions[i]
				}
			}
			if got == nil || got.Status != c.status || got.Reason != c.reason || !strings.Contains(got.Message, c.msg) || (c.not != "" && strings.Contains(got.Message, c.not)) {
				t.Fatalf("RegistryIndependent %+v, want %s/%s containing %q (and not %q)", got, c.status, c.reason, c.msg, c.not)
			}
		})
	}
}
