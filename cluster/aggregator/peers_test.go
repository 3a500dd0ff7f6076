package aggregator

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
)

func peerReport(node, address string, seq uint64, sets ...string) *v1.NodeReport {
	n := status.Node{Node: status.NodeInfo{Name: node}}
	if address != "" {
		n.Node.Peers = &status.PeerBytes{Address: address}
	}
	for _, s := range sets {
		n.Sets = append(n.Sets, status.Set{Name: s, Phase: status.Ready})
	}
	return v1.FromStatus(n, "boot", seq, time.Minute)
}

// The ack of a node that shares carries the peers of the sets it pins: nodes that pin
// another set, or share nothing, are not among them; a node that leaves a set, or is
// forgotten, leaves the lists.
func TestPeersOfTheSameSets(t *testing.T) {
	now := time.Now()
	s := NewStore(DefaultLimits(), func() time.Time { return now })
	ingest := func(r *v1.NodeReport) {
		if _, err := s.Ingest(r.GetNode(), r); err != nil {
			t.Fatal(err)
		}
	}
	ingest(peerReport("w1", "10.0.0.1:7444", 1, "ocp"))
	ingest(peerReport("w2", "10.0.0.2:7444", 1, "ocp", "apps"))
	ingest(peerReport("w3", "10.0.0.3:7444", 1, "apps"))
	ingest(peerReport("w4", "", 1, "ocp"))
	for node, want := range map[string][]string{
		"w1": {"10.0.0.1:7444", "10.0.0.2:7444"},
		"w2": {"10.0.0.1:7444", "10.0.0.2:7444", "10.0.0.3:7444"},
		"w3": {"10.0.0.2:7444", "10.0.0.3:7444"},
		"w4": nil,
	} {
		if got := s.Peers(node); !slices.Equal(got, want) {
			t.Errorf("%s: peers %v, want %v", node, got, want)
		}
	}
	ingest(peerReport("w2", "10.0.0.2:7444", 2, "apps")) // w2 leaves ocp
	if got := s.Peers("w1"); !slices.Equal(got, []string{"10.0.0.1:7444"}) {
		t.Errorf("after w2 left ocp, w1's peers: %v", got)
	}
	ingest(peerReport("w3", "10.0.0.33:7444", 2, "apps")) // a new address
	if got := s.Peers("w2"); !slices.Equal(got, []string{"10.0.0.2:7444", "10.0.0.33:7444"}) {
		t.Errorf("after w3 moved, w2's peers: %v", got)
	}
	now = now.Add(time.Hour)
	s.Forget(30*time.Minute, nil)
	ingest(peerReport("w1", "10.0.0.1:7444", 3, "ocp", "apps"))
	if got := s.Peers("w1"); !slices.Equal(got, []string{"10.0.0.1:7444"}) {
		t.Errorf("after the others were forgotten, w1's peers: %v", got)
	}
}

// A node whose reports stopped (taken out, down: Unknown) is not handed out: a node
// joining would lay its blobs' trees through it and wait for it. It is again once it
// reports.
func TestAPeerThatStoppedReportingIsNotHandedOut(t *testing.T) {
	now := time.Now()
	s := NewStore(DefaultLimits(), func() time.Time { return now })
	ingest := func(r *v1.NodeReport) {
		if _, err := s.Ingest(r.GetNode(), r); err != nil {
			t.Fatal(err)
		}
	}
	ingest(peerReport("w1", "10.0.0.1:7444", 1, "ocp"))
	ingest(peerReport("w2", "10.0.0.2:7444", 1, "ocp"))
	now = now.Add(UnknownAfter*time.Minute + time.Second) // heartbeat: a minute
	ingest(peerReport("w1", "10.0.0.1:7444", 2, "ocp"))
	ingest(peerReport("w3", "10.0.0.3:7444", 1, "ocp")) // a node joining
	if got, want := s.Peers("w3"), []string{"10.0.0.1:7444", "10.0.0.3:7444"}; !slices.Equal(got, want) {
		t.Fatalf("w2 silent for %d heartbeats: w3's peers %v, want %v", UnknownAfter, got, want)
	}
	ingest(peerReport("w2", "10.0.0.2:7444", 2, "ocp"))
	if got, want := s.Peers("w3"), []string{"10.0.0.1:7444", "10.0.0.2:7444", "10.0.0.3:7444"}; !slices.Equal(got, want) {
		t.Fatalf("w2 reporting again: w3's peers %v, want %v", got, want)
	}
}

// A large set hands out at most MaxPeers addresses, the same for every node of it.
func TestPeersAreBounded(t *testing.T) {
	s := NewStore(DefaultLimits(), time.Now)
	for i := range 300 {
		r := peerReport(fmt.Sprintf("w%d", i), fmt.Sprintf("10.0.%d.%d:7444", i/250, i%250), 1, "ocp")
		if _, err := s.Ingest(r.GetNode(), r); err != nil {
			t.Fatal(err)
		}
	}
	a, b := s.Peers("w0"), s.Peers("w299")
	if len(a) != MaxPeers || !slices.Equal(a, b) {
		t.Fatalf("%d and %d peers, equal %v", len(a), len(b), slices.Equal(a, b))
	}
}

// The ack over gRPC carries them.
func TestReportAckCarriesPeers(t *testing.T) {
	c := newCluster(t, DefaultLimits())
	ctx := context.Background()
	for _, n := range []string{"w1", "w2"} {
		cert, _ := c.kubeletCA.Node(c.dir, n)
		ack, err := c.rawClient(cert).Report(ctx, peerReport(n, n+".example:7444", 1, "ocp"))
		if err != nil {
			t.Fatal(err)
		}
		if n == "w2" && !slices.Equal(ack.GetPeers(), []string{"w1.example:7444", "w2.example:7444"}) {
			t.Fatalf("w2's ack: %v", ack.GetPeers())
		}
	}
}

// A set's rollup sums the bytes its nodes fetched from registries.
func TestRollupSumsRegistryBytes(t *testing.T) {
	s := NewStore(DefaultLimits(), time.Now)
	for i, n := range []int64{10 << 20, 5 << 20} {
		node := fmt.Sprintf("w%d", i)
		r := v1.FromStatus(status.Node{Node: status.NodeInfo{Name: node},
			Sets: []status.Set{{Name: "ocp", Phase: status.Ready, BytesFromRegistry: n}}}, "boot", 1, time.Minute)
		if _, err := s.Ingest(node, r); err != nil {
			t.Fatal(err)
		}
	}
	v, ok := s.Set("ocp", false)
	if !ok || v.BytesFromRegistry != 15<<20 {
		t.Fatalf("ocp: %d bytes from registries, want %d", v.BytesFromRegistry, 15<<20)
	}
}
