package clusterstatus

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/status"
)

// Reasons of the set conditions.
const (
	ReasonAllNodesReady    = "AllNodesReady"
	ReasonNodesFailed      = "NodesFailed"
	ReasonNodesUnknown     = "NodesUnknown"
	ReasonNodesProgressing = "NodesProgressing"
	ReasonNoNodesTargeted  = "NoNodesTargeted"
	ReasonInvalidSpec      = "InvalidSpec"
	ReasonPulling          = "Pulling"
	ReasonIdle             = "Idle"
	ReasonNotDegraded      = "AsExpected"

	// RegistryIndependent's reasons (with the nodes' own for their pods' start:
	// CredentialVerification, …, and the count of the blobs' holders for a node joining:
	// status.ReasonBlobsNotHeld, status.ReasonBlobHoldersUnknown).
	ReasonPodsStartWithoutRegistry = "PodsStartWithoutRegistry"
	ReasonNotAllNodesReady         = "NotAllNodesReady"
)

// BuildStatus turns a set's rollup into its status. prev are the object's current
// conditions (their transition times are kept when the status does not change);
// invalid is the node parser's error for the object, if any.
func BuildStatus(generation int64, v aggregator.SetView, invalid string, prev []metav1.Condition, now time.Time) v1alpha1.Status {
	st := v1alpha1.Status{
		ObservedGeneration: generation,
		Nodes:              fmt.Sprintf("%d/%d", v.ReadyNodes, v.Targeted),
		TargetedNodes:      v.Targeted,
		ReadyNodes:         v.ReadyNodes,
		ProgressingNodes:   v.ProgressingNodes,
		FailedNodes:        v.FailedNodes,
		UnknownNodes:       v.UnknownNodes,
		ImagesTotal:        v.ImagesTotal,
		ImagesReady:        v.ImagesReady,
		BytesTotal:         v.BytesTotal,
		BytesReady:         v.BytesReady,
		Progress:           progress(v),
		FailingNodes:       failing(v),
	}
	if v.ETASeconds != nil && v.ProgressingNodes > 0 {
		// Rounded: an estimate that moves every second is not worth a write every second.
		eta := (int64(*v.ETASeconds) + 9) / 10 * 10
		st.ETASeconds = &eta
	}
	conds := append([]metav1.Condition(nil), prev...)
	set := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		if len(msg) > 4000 {
			msg = msg[:4000] + "…"
		}
		meta.SetStatusCondition(&conds, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))})
	}
	counts := fmt.Sprintf("%d/%d nodes ready; %d failed, %d unknown, %d progressing", v.ReadyNodes, v.Targeted, v.FailedNodes, v.UnknownNodes, v.ProgressingNodes)
	switch {
	case invalid != "":
		set(v1alpha1.ConditionReady, false, ReasonInvalidSpec, invalid)
		set(v1alpha1.ConditionProgressing, false, ReasonInvalidSpec, "nodes do not act on a set they cannot parse")
		set(v1alpha1.ConditionDegraded, true, ReasonInvalidSpec, invalid)
		return finish(st, conds)
	case v.Targeted == 0:
		set(v1alpha1.ConditionReady, false, ReasonNoNodesTargeted, "the set selects no Node: check spec.nodeSelector and the "+v1alpha1.RoleLabel+" label ({} selects every node)")
		set(v1alpha1.ConditionProgressing, false, ReasonIdle, "no node to pin on")
		set(v1alpha1.ConditionDegraded, false, ReasonNotDegraded, "")
		return finish(st, conds)
	case v.Ready:
		set(v1alpha1.ConditionReady, true, ReasonAllNodesReady, counts)
	case v.FailedNodes > 0:
		set(v1alpha1.ConditionReady, false, ReasonNodesFailed, counts)
	case v.UnknownNodes > 0:
		set(v1alpha1.ConditionReady, false, ReasonNodesUnknown, counts)
	default:
		set(v1alpha1.ConditionReady, false, ReasonNodesProgressing, counts)
	}
	if v.ProgressingNodes > 0 {
		msg := fmt.Sprintf("%d nodes pulling or waiting", v.ProgressingNodes)
		if st.ETASeconds != nil {
			msg += fmt.Sprintf("; about %s to go", (time.Duration(*st.ETASeconds) * time.Second).String())
		}
		set(v1alpha1.ConditionProgressing, true, ReasonPulling, msg)
	} else {
		set(v1alpha1.ConditionProgressing, false, ReasonIdle, "no node is pulling")
	}
	// Degraded: nodes that cannot progress without a change, or that are gone. A node that
	// reports but has not caught up with the set yet (NotReceived, SpecNotSynced) is not
	// degraded: that is the normal seconds after an apply.
	var bad []string
	reasons := map[string]int{}
	for _, n := range v.Nodes {
		switch {
		case n.Phase == "Failed":
			reasons[n.Reason]++
		case n.Phase == aggregator.PhaseUnknown && (n.Reason == aggregator.ReasonNeverReported || n.Reason == aggregator.ReasonNodeSilent || n.Reason == aggregator.ReasonFileError):
			reasons[ReasonNodesUnknown]++
		default:
			continue
		}
		if len(bad) < 3 {
			bad = append(bad, fmt.Sprintf("%s: %s: %s", n.Node, n.Reason, n.Message))
		}
	}
	registryIndependent(v, set)
	if len(reasons) > 0 {
		reason, most := "", 0
		for r, c := range reasons {
			if c > most || (c == most && r < reason) {
				reason, most = r, c
			}
		}
		if reason == "" {
			reason = ReasonNodesFailed
		}
		set(v1alpha1.ConditionDegraded, true, reason, counts+"; "+strings.Join(bad, "; "))
	} else {
		set(v1alpha1.ConditionDegraded, false, ReasonNotDegraded, "")
	}
	return finish(st, conds)
}

func finish(st v1alpha1.Status, conds []metav1.Condition) v1alpha1.Status {
	order := map[string]int{v1alpha1.ConditionReady: 0, v1alpha1.ConditionProgressing: 1, v1alpha1.ConditionDegraded: 2, v1alpha1.ConditionRegistryIndependent: 3}
	var out []metav1.Condition
	for _, c := range conds {
		if _, ours := order[c.Type]; ours {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return order[out[i].Type] < order[out[j].Type] })
	st.Conditions = out
	if st.FailingNodes == nil {
		st.FailingNodes = []v1alpha1.NodeState{}
	}
	return st
}

func progress(v aggregator.SetView) string {
	if v.Targeted == 0 {
		return ""
	}
	if v.Ready {
		return "100%"
	}
	var pct uint64
	switch {
	case v.BytesTotal > 0:
		pct = v.BytesReady * 100 / v.BytesTotal
	case v.ImagesTotal > 0:
		pct = uint64(v.ImagesReady) * 100 / uint64(v.ImagesTotal)
	}
	// Nodes that did not report the set have done none of it.
	if reported := v.Targeted - v.UnknownNodes; reported < v.Targeted {
		pct = pct * uint64(reported) / uint64(v.Targeted)
	}
	return fmt.Sprintf("%d%%", min(pct, 99))
}

// failing lists Failed nodes, then Unknown ones, at most MaxFailingNodes.
func failing(v aggregator.SetView) []v1alpha1.NodeState {
	var failed, unknown []v1alpha1.NodeState
	for _, n := range v.Nodes {
		s := v1alpha1.NodeState{Node: n.Node, Phase: n.Phase, Reason: n.Reason, Message: n.Message}
		if len(s.Message) > 1000 {
			s.Message = s.Message[:1000] + "…"
		}
		switch n.Phase {
		case "Failed":
			failed = append(failed, s)
		case aggregator.PhaseUnknown:
			unknown = append(unknown, s)
		}
	}
	out := append(failed, unknown...)
	if len(out) > v1alpha1.MaxFailingNodes {
		out = out[:v1alpha1.MaxFailingNodes]
	}
	return out
}

// registryIndependent sets the RegistryIndependent condition: True when pods start from
// the set's images with the registry gone on every targeted node and every blob of the
// images is held by status.MinBlobHolders nodes. Else False, saying apart each of what
// stands in the way: the Ready nodes where pods would need the registry when they start
// (named, with their imagepind's reason: CredentialVerification, TagsNotHeld, …), the
// nodes not Ready (NotAllNodesReady), and the blobs held by too few nodes for a node to
// join or be replaced (BlobsNotHeld, naming them, their holders and who would fail;
// BlobHoldersUnknown when they cannot be counted). The reason is the first of those.
func registryIndependent(v aggregator.SetView, set func(t string, ok bool, reason, msg string)) {
	if v.RegistryGone() {
		set(v1alpha1.ConditionRegistryIndependent, true, ReasonPodsStartWithoutRegistry,
			fmt.Sprintf("on all %d nodes, pods start from these images with the registry gone; each of the %d blobs of the images is held by %d nodes or more, so a node joining or replacing one gets them from its peers",
				v.Targeted, v.BlobHolders.Blobs, status.MinBlobHolders))
		return
	}
	var reason string
	var parts []string
	add := func(r, part string) {
		if reason == "" {
			reason = r
		}
		parts = append(parts, part)
	}
	if v.RegistryDependentNodes > 0 {
		var nodes []string
		for _, n := range v.RegistryDependent {
			nodes = append(nodes, fmt.Sprintf("%s: %s: %s", n.Node, n.Reason, n.Message))
		}
		if more := v.RegistryDependentNodes - len(v.RegistryDependent); more > 0 {
			nodes = append(nodes, fmt.Sprintf("and %d more", more))
		}
		add(v.RegistryDependent[0].Reason, fmt.Sprintf("%d of %d Ready nodes would need the registry when a pod starts: %s",
			v.RegistryDependentNodes, v.ReadyNodes, strings.Join(nodes, "; ")))
	}
	if v.ReadyNodes < v.Targeted {
		add(ReasonNotAllNodesReady, fmt.Sprintf("%d/%d nodes ready: a node without every image present and pinned needs the registry", v.ReadyNodes, v.Targeted))
	}
	switch v.BlobHolders.Status {
	case status.True:
	case status.False:
		add(status.ReasonBlobsNotHeld, "a node joining or replacing one would need the registry: "+v.BlobHolders.Why())
	default:
		add(status.ReasonBlobHoldersUnknown, "whether a node joining or replacing one would need the registry cannot be told: "+v.BlobHolders.Why())
	}
	msg := strings.Join(parts, "; ")
	if v.PodsStartNodes == v.Targeted {
		msg = fmt.Sprintf("on all %d nodes, pods start from these images with the registry gone, but %s", v.Targeted, msg)
	}
	set(v1alpha1.ConditionRegistryIndependent, false, reason, msg)
}
