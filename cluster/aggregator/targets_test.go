package aggregator

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
)

// With targets from the API, a set rolls up over exactly its targeted nodes: each one
// without a current report of the set is Unknown with the reason why, a node on an older
// spec is not Ready, and nodes that are not targeted do not count.
func TestTargetRollup(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	clock := now
	s := NewStore(DefaultLimits(), func() time.Time { return clock })
	ready := status.Set{Name: "s", SpecHash: "h1", Phase: status.Ready, ImagesTotal: 2, ImagesReady: 2}
	old := ready
	old.SpecHash = "h0"
	ingest := func(node string, seq uint64, n status.Node) {
		t.Helper()
		n.Node.Name = node
		if _, err := s.Ingest(node, v1.FromStatus(n, "boot", seq, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	ingest("ready", 1, status.Node{Sets: []status.Set{ready}})
	ingest("old", 1, status.Node{Sets: []status.Set{old}})
	ingest("without", 1, status.Node{})
	ingest("refuses", 1, status.Node{FileErrors: []status.FileError{{File: "cluster/s.json", Error: "cluster/s.json: metadata.name: set \"s\" is already defined in local.yaml"}}})
	ingest("silent", 1, status.Node{Sets: []status.Set{ready}})
	ingest("untargeted", 1, status.Node{Sets: []status.Set{{Name: "s", SpecHash: "h1", Phase: status.Failed}}})
	// "silent" stops reporting; the others go on.
	clock = now.Add(4 * time.Minute)
	for _, n := range []string{"ready", "old", "without", "refuses", "untargeted"} {
		s.nodes[n].received = clock
	}
	s.SetTargets(map[string]Target{"s": {SpecHash: "h1", File: "cluster/s.json",
		Nodes: []string{"ready", "old", "without", "refuses", "silent", "ghost"}}})

	v, ok := s.Set("s", true)
	if !ok {
		t.Fatal("no view")
	}
	if v.Targeted != 6 || v.ReadyNodes != 1 || v.ProgressingNodes != 1 || v.UnknownNodes != 4 || v.FailedNodes != 0 || v.Ready {
		t.Fatalf("counts %+v", v)
	}
	want := map[string]string{"ready": "", "old": ReasonSpecNotSynced, "without": ReasonNotReceived, "refuses": ReasonFileError,
		"silent": ReasonNodeSilent, "ghost": ReasonNeverReported}
	for _, n := range v.Nodes {
		if n.Node == "ready" {
			continue
		}
		if w, ok := want[n.Node]; !ok || n.Reason != w {
			t.Errorf("%s: reason %q, want %q (%s)", n.Node, n.Reason, w, n.Message)
		}
	}
	// The same targets serve the JSON list: the untargeted node's failure does not count.
	for _, sv := range s.SetsSummary() {
		if sv.Name == "s" && sv.FailedNodes != 0 {
			t.Fatalf("an untargeted node counted: %+v", sv)
		}
	}
}

// A name clash between a local file and a cluster set: the node reports the local set
// (another spec) and a FileError for the cluster file. That is a FileError, Unknown, not
// SpecNotSynced: waiting does not fix it. Before the fix it stayed SpecNotSynced,
// Progressing forever, Degraded=False.
func TestNameClashIsAFileErrorNotSpecNotSynced(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	s := NewStore(DefaultLimits(), func() time.Time { return now })
	local := status.Set{Name: "foo", SpecHash: "local", File: "z-foo.yaml", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1}
	n := status.Node{Node: status.NodeInfo{Name: "w1"}, Sets: []status.Set{local},
		FileErrors: []status.FileError{{File: "cluster/foo.json", Error: `cluster/foo.json: metadata.name: set "foo" is already defined in z-foo.yaml; this file is ignored`}}}
	if _, err := s.Ingest("w1", v1.FromStatus(n, "boot", 1, time.Minute)); err != nil {
		t.Fatal(err)
	}
	s.SetTargets(map[string]Target{"foo": {SpecHash: "api", File: "cluster/foo.json", Nodes: []string{"w1"}}})
	v, _ := s.Set("foo", true)
	if v.ProgressingNodes != 0 || v.UnknownNodes != 1 || len(v.Nodes) != 1 {
		t.Fatalf("counts %+v", v)
	}
	if got := v.Nodes[0]; got.Reason != ReasonFileError || got.Phase != PhaseUnknown || !strings.Contains(got.Message, "already defined in z-foo.yaml") {
		t.Fatalf("node %+v", got)
	}
}
