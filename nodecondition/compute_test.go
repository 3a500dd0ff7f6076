package nodecondition

import (
	"fmt"
	"strings"
	"testing"

	"github.com/imagepin/imagepin/status"
)

func set(name string, phase status.Phase, registry string) status.Set {
	s := status.Set{Name: name, Phase: phase, ImagesTotal: 4, ImagesReady: 1}
	if registry != "" {
		// The node-local part says the same: the kubelet, or every image held.
		reason, own := status.ReasonCredentialVerification, status.ReasonCredentialVerification
		if registry == status.True {
			reason, own = status.ReasonPodsStartWithoutRegistry, status.ReasonImagesHeld
		}
		s.Conditions = append(s.Conditions, status.Condition{Type: status.ConditionRegistryIndependent, Status: registry, Reason: reason},
			status.Condition{Type: status.ConditionPodsStartWithoutRegistry, Status: registry, Reason: own})
	}
	if phase == status.Failed {
		s.Conditions = append(s.Conditions, status.Condition{Type: status.ConditionFailed, Status: status.True, Reason: status.ReasonInsufficientDiskSpace})
	}
	return s
}

// stranded is a Ready set whose pods start on this node without the registry but whose
// blobs too few nodes hold (or cannot be counted), in the words of its
// RegistryIndependent.
func stranded(name, reason, message string) status.Set {
	return strandedAnd(name, reason, message, status.Condition{Type: status.ConditionPodsStartWithoutRegistry, Status: status.True, Reason: status.ReasonImagesHeld})
}

// strandedAnd is stranded with its node-local condition own.
func strandedAnd(name, reason, message string, own status.Condition) status.Set {
	s := set(name, status.Ready, "")
	s.Conditions = append(s.Conditions, status.Condition{Type: status.ConditionRegistryIndependent, Status: status.False, Reason: reason, Message: message}, own)
	return s
}

// Which fact wins: not synced (nothing written), Failed, not Ready, registry dependent.
// Blobs held by too few nodes, a cluster's verdict, are said but hold nothing back.
func TestCompute(t *testing.T) {
	for _, tc := range []struct {
		name     string
		node     status.Node
		mode     Mode
		ok       bool
		status   string
		reason   string
		contains []string
	}{
		{name: "not synced yet", node: status.Node{WaitingForClusterSync: true, Faults: []string{status.FaultWaitingForClusterSync}, Sets: []status.Set{set("a", status.Ready, status.True)}}},
		// The fact is the field, not a fault's words: a fault that reads the same (a set
		// file's name, a registry's message) holds nothing back.
		{name: "a fault in the sync's words", node: status.Node{Faults: []string{status.FaultWaitingForClusterSync}, Sets: []status.Set{set("a", status.Ready, "")}},
			ok: true, status: status.True, reason: ReasonAllSetsReady},
		{name: "no sets", ok: true, status: status.True, reason: ReasonAllSetsReady, contains: []string{"no PinnedImageSet"}},
		{name: "all ready", node: status.Node{Sets: []status.Set{set("a", status.Ready, ""), set("b", status.Ready, "")}},
			ok: true, status: status.True, reason: ReasonAllSetsReady, contains: []string{"2 of 2 sets Ready: a, b"}},
		{name: "other faults do not hold it back", node: status.Node{Faults: []string{"cluster API: down"}, Sets: []status.Set{set("a", status.Ready, "")}},
			ok: true, status: status.True, reason: ReasonAllSetsReady},
		{name: "pulling", node: status.Node{Sets: []status.Set{set("a", status.Ready, ""), set("b", status.Pulling, ""), set("c", status.Pending, "")}},
			ok: true, status: status.False, reason: ReasonSetsNotReady, contains: []string{"b (Pulling 1/4 images)", "c (Pending)"}},
		{name: "failed wins", node: status.Node{Sets: []status.Set{set("b", status.Pulling, ""), set("a", status.Failed, "")}},
			ok: true, status: status.False, reason: ReasonSetsDegraded, contains: []string{"a (Failed: InsufficientDiskSpace)", "not Ready yet: b"}},
		{name: "registry dependent ignored in Ready mode", node: status.Node{Sets: []status.Set{set("a", status.Ready, status.False)}},
			ok: true, status: status.True, reason: ReasonAllSetsReady},
		{name: "registry dependent", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{set("a", status.Ready, status.False), set("b", status.Ready, status.True), set("c", status.Ready, "")}},
			ok: true, status: status.False, reason: ReasonRegistryDependent, contains: []string{"a (CredentialVerification)", "c (not reported)"}},
		{name: "registry independent", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{set("b", status.Ready, status.True)}},
			ok: true, status: status.True, reason: ReasonAllSetsReady, contains: []string{"Ready and registry independent"}},
		{name: "tags not held yet", node: status.Node{Sets: []status.Set{set("a", status.Ready, "")}, Tags: &status.Tags{Pinned: 3, Held: 1, Kept: true}},
			ok: true, status: status.False, reason: ReasonTagsNotHeld, contains: []string{"2 of 3 pinned tags"}},
		{name: "tags held", node: status.Node{Sets: []status.Set{set("a", status.Ready, "")}, Tags: &status.Tags{Pinned: 3, Held: 3, Kept: true}},
			ok: true, status: status.True, reason: ReasonAllSetsReady},
		{name: "tags not pre-loaded at all do not hold Ready back", node: status.Node{Sets: []status.Set{set("a", status.Ready, "")}, Tags: &status.Tags{Pinned: 3}},
			ok: true, status: status.True, reason: ReasonAllSetsReady},
		{name: "tags not pre-loaded at all are registry dependent", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{set("a", status.Ready, status.True)}, Tags: &status.Tags{Pinned: 3}},
			ok: true, status: status.False, reason: ReasonRegistryDependent, contains: []string{"3 pinned tags (not pre-loaded on this node)"}},
		{name: "sets not ready beat tags", node: status.Node{Sets: []status.Set{set("a", status.Pulling, "")}, Tags: &status.Tags{Pinned: 3, Kept: true}},
			ok: true, status: status.False, reason: ReasonSetsNotReady},
		// A joining node's own pods start once its runtime holds its images: the cluster's
		// count of holders (which waits for every node's report) is said, and holds
		// neither the condition nor the startup taint.
		{name: "blobs held by too few nodes", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{
			stranded("a", status.ReasonBlobsNotHeld, "1 of the 9 blobs of the images are held by fewer than 2 nodes (…): sha256:1… is held by w1 only: a node replacing w1 would fail"),
			stranded("b", status.ReasonBlobHoldersUnknown, "whether every blob of the images is held by 2 nodes cannot be told: no answer from the aggregator yet"),
			set("c", status.Ready, status.True)}},
			ok: true, status: status.True, reason: ReasonAllSetsReady, contains: []string{
				"3 of 3 sets Ready and registry independent on this node: a, b, c; a node joining or replacing one would need the registry: " +
					"blobs of the images of a (BlobsNotHeld), b (BlobHoldersUnknown) are not held by 2 nodes (their RegistryIndependent names them)"}},
		// The count short and this node's own pods not sure to start (the kubelet's
		// verification undecided): registry dependent.
		{name: "blobs held by too few nodes and the node's own pods unsure", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{
			strandedAnd("a", status.ReasonBlobsNotHeld, "",
				status.Condition{Type: status.ConditionPodsStartWithoutRegistry, Status: status.False, Reason: status.ReasonCredentialVerification})}},
			ok: true, status: status.False, reason: ReasonRegistryDependent, contains: []string{"a (CredentialVerification)"}},
		{name: "blobs held by too few nodes ignored in Ready mode", node: status.Node{Sets: []status.Set{stranded("a", status.ReasonBlobsNotHeld, "")}},
			ok: true, status: status.True, reason: ReasonAllSetsReady},
		{name: "registry dependent beats blobs held by too few nodes", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{
			stranded("a", status.ReasonBlobsNotHeld, "held by w1 only"), set("b", status.Ready, status.False)}},
			ok: true, status: status.False, reason: ReasonRegistryDependent, contains: []string{"pods would need the registry to start from their images: a (BlobsNotHeld), b (CredentialVerification)"}},
		// The whole's sure BlobsNotHeld goes before an unsure kubelet: the node-local
		// part tells it, and pods on this node may need the registry.
		{name: "the kubelet unsure behind blobs held by too few nodes", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{
			strandedAnd("a", status.ReasonBlobsNotHeld, "held by w1 only; the kubelet's gate not known",
				status.Condition{Type: status.ConditionPodsStartWithoutRegistry, Status: status.Unknown, Reason: status.ReasonCredentialVerification})}},
			ok: true, status: status.False, reason: ReasonRegistryDependent, contains: []string{"pods would need the registry to start from their images: a (CredentialVerification)"}},
		// An imagepind that says only the whole: its own pods are not taken to start.
		{name: "the node-local part not reported", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{
			func() status.Set {
				s := set("a", status.Ready, "")
				s.Conditions = append(s.Conditions, status.Condition{Type: status.ConditionRegistryIndependent, Status: status.False, Reason: status.ReasonBlobsNotHeld})
				return s
			}()}},
			ok: true, status: status.False, reason: ReasonRegistryDependent, contains: []string{"a (not reported)"}},
		{name: "not ready beats registry dependent", mode: RegistryIndependent, node: status.Node{Sets: []status.Set{set("a", status.Ready, status.False), set("b", status.Pulling, "")}},
			ok: true, status: status.False, reason: ReasonSetsNotReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := Compute(tc.node, tc.mode)
			if ok != tc.ok {
				t.Fatalf("ok = %v", ok)
			}
			if !ok {
				return
			}
			if c.Status != tc.status || c.Reason != tc.reason {
				t.Fatalf("got %+v", c)
			}
			for _, s := range tc.contains {
				if !strings.Contains(c.Message, s) {
					t.Errorf("message %q lacks %q", c.Message, s)
				}
			}
		})
	}
}

// The message names the first sets and counts the rest: a Node's condition stays small.
func TestComputeBoundsTheMessage(t *testing.T) {
	var n status.Node
	for i := range 200 {
		n.Sets = append(n.Sets, set(fmt.Sprintf("set-%03d", i), status.Pending, ""))
	}
	c, _ := Compute(n, Ready)
	if !strings.Contains(c.Message, "set-009 (Pending) and 190 more") || strings.Contains(c.Message, "set-010") || len(c.Message) > 400 {
		t.Fatalf("message %q", c.Message)
	}
}
