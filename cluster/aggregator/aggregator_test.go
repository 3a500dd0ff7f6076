package aggregator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/report"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/testcerts"
)

type cluster struct {
	t         *testing.T
	dir       string
	kubeletCA *testcerts.CA
	serverCA  *testcerts.CA
	store     *Store
	grpcAddr  string
	httpURL   string
	http      *http.Client
	log       *logrus.Logger
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

func newCluster(t *testing.T, limits Limits) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{t: t, dir: dir, log: logrus.New()}
	c.log.SetOutput(io.Discard)
	var err error
	if c.kubeletCA, err = testcerts.NewCA(dir, "kubelet-client-ca"); err != nil {
		t.Fatal(err)
	}
	if c.serverCA, err = testcerts.NewCA(dir, "aggregator-ca"); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := c.serverCA.Server(dir, "aggregator")
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig, err := ServerTLS(certFile, keyFile, c.kubeletCA.File)
	if err != nil {
		t.Fatal(err)
	}
	c.store = NewStore(limits, time.Now)
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	c.grpcAddr, c.httpURL = gl.Addr().String(), "https://"+hl.Addr().String()
	readTLS, err := ReadTLS(certFile, keyFile, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.http, err = c.serverCA.HTTPClient(""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Add(2)
	go func() { defer c.wg.Done(); ServeGRPC(ctx, gl, tlsConfig, c.store, c.log) }()
	go func() { defer c.wg.Done(); ServeHTTP(ctx, hl, ReadHandler(c.store, nil), readTLS) }()
	t.Cleanup(func() { cancel(); c.wg.Wait() })
	return c
}

// node is a reporter with its own certificate.
type node struct {
	name   string
	r      *report.Reporter
	cancel context.CancelFunc
	done   chan struct{}
}

func (c *cluster) node(name string, heartbeat time.Duration) *node {
	c.t.Helper()
	cert, err := c.kubeletCA.Node(c.dir, name)
	if err != nil {
		c.t.Fatal(err)
	}
	// Verify the server under its certificate's DNS name while dialing an IP, as nodes do
	// through a NodePort.
	r := report.New(report.Config{Aggregator: c.grpcAddr, Heartbeat: heartbeat, CertFile: cert, CAFile: c.serverCA.File, ServerName: "localhost"}, c.log)
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{name: name, r: r, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(n.done); r.Run(ctx) }()
	c.t.Cleanup(n.stop)
	return n
}

func (n *node) stop() { n.cancel(); <-n.done }

func (n *node) send(sets ...status.Set) {
	n.r.Update(status.Node{Updated: time.Now(), Node: status.NodeInfo{Name: n.name, Architecture: "amd64"}, Sets: sets})
}

func set(name string, phase status.Phase, ready, total int) status.Set {
	s := status.Set{Name: name, UID: "u-" + name, SpecHash: "h1", Phase: phase, ImagesTotal: total, ImagesReady: ready}
	reason := map[status.Phase]string{status.Ready: status.ReasonAllImagesPinned, status.Failed: status.ReasonImageUnavailable,
		status.Pulling: status.ReasonPulling, status.Pending: status.ReasonWaitingForReload}[phase]
	s.Conditions = []status.Condition{{Type: status.ConditionReady, Status: map[bool]string{true: "True", false: "False"}[phase == status.Ready],
		Reason: reason, Message: "msg " + string(phase)}}
	if phase == status.Failed {
		s.FailedImages = []status.FailedImage{{Image: "quay.io/x@sha256:" + strings.Repeat("1", 64), Reason: status.ReasonImageUnavailable, Error: "manifest unknown"}}
	}
	return s
}

func (c *cluster) get(path string, v any) int {
	c.t.Helper()
	resp, err := c.http.Get(c.httpURL + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil && resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			c.t.Fatal(err)
		}
	}
	return resp.StatusCode
}

func (c *cluster) waitSet(name, what string, cond func(SetView) bool) SetView {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var v SetView
	for time.Now().Before(deadline) {
		if c.get("/v1/sets/"+name, &v) == 200 && cond(v) {
			return v
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("timed out waiting for %s: %+v", what, v)
	return v
}

func TestReadinessTransitions(t *testing.T) {
	c := newCluster(t, DefaultLimits())
	hb := 200 * time.Millisecond
	w1, w2, w3 := c.node("w1", hb), c.node("w2", hb), c.node("w3", hb)
	for _, n := range []*node{w1, w2, w3} {
		n.send(set("upgrade", status.Ready, 3, 3))
	}
	v := c.waitSet("upgrade", "all ready", func(v SetView) bool { return v.Ready && v.Targeted == 3 })
	if v.ReadyNodes != 3 || v.ImagesReady != 9 {
		t.Fatalf("%+v", v)
	}

	// One failing: not ready, and the failing node says why.
	w2.send(set("upgrade", status.Failed, 2, 3))
	v = c.waitSet("upgrade", "one failing", func(v SetView) bool { return !v.Ready && v.FailedNodes == 1 })
	for _, n := range v.Nodes {
		if n.Node == "w2" && (n.Phase != "Failed" || n.Reason != status.ReasonImageUnavailable || n.Message != "msg Failed" || len(n.FailedImages) != 1) {
			t.Fatalf("w2: %+v", n)
		}
	}
	w2.send(set("upgrade", status.Ready, 3, 3))
	c.waitSet("upgrade", "ready again", func(v SetView) bool { return v.Ready })

	// One silent for 3 heartbeats: Unknown, not ready.
	w3.stop()
	v = c.waitSet("upgrade", "one silent", func(v SetView) bool { return !v.Ready && v.UnknownNodes == 1 })
	var nodes []NodeView
	c.get("/v1/nodes", &nodes)
	if len(nodes) != 3 || !nodes[2].Unknown || nodes[2].Name != "w3" || nodes[0].Unknown {
		t.Fatalf("nodes %+v", nodes)
	}

	// A new node that reports the set turns it back to not ready.
	w3b := c.node("w3", hb) // w3 comes back
	w3b.send(set("upgrade", status.Ready, 3, 3))
	c.waitSet("upgrade", "w3 back", func(v SetView) bool { return v.Ready && v.Targeted == 3 })
	w4 := c.node("w4", hb)
	w4.send(set("upgrade", status.Pulling, 1, 3))
	v = c.waitSet("upgrade", "a new node", func(v SetView) bool { return !v.Ready && v.Targeted == 4 && v.ProgressingNodes == 1 })

	// By default only the nodes that need attention are listed; ?nodes=all lists all.
	var all SetView
	c.get("/v1/sets/upgrade?nodes=all", &all)
	if len(v.Nodes) != 1 || v.Nodes[0].Node != "w4" || len(all.Nodes) != 4 || v.ReadyNodes != 3 || all.ReadyNodes != 3 {
		t.Fatalf("default lists %d nodes, all %d", len(v.Nodes), len(all.Nodes))
	}

	// Metrics and health on the read listener.
	resp, err := c.http.Get(c.httpURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`imagepin_aggregator_set_nodes{set="upgrade",state="ready"} 3`, `imagepin_aggregator_set_nodes{set="upgrade",state="progressing"} 1`,
		`imagepin_aggregator_set_ready{set="upgrade"} 0`, `imagepin_aggregator_set_images_ready{set="upgrade"} 10`, `imagepin_aggregator_node_report_age_seconds{node="w4"}`,
		// Ready nodes that do not report RegistryIndependent count as needing the registry.
		`imagepin_aggregator_set_registry_dependent_nodes{set="upgrade"} 3`, `imagepin_aggregator_set_registry_independent_nodes{set="upgrade"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if code := c.get("/healthz", nil); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if code := c.get("/v1/sets/nope", nil); code != 404 {
		t.Fatalf("unknown set: %d", code)
	}
	var nv struct {
		NodeView
		Report status.Node `json:"report"`
	}
	if c.get("/v1/nodes/w4", &nv); nv.Report.Node.Name != "w4" || nv.Report.Sets[0].ImagesReady != 1 {
		t.Fatalf("node w4: %+v", nv)
	}
}

// rawClient calls Report directly with a node's certificate.
func (c *cluster) rawClient(certFile string) v1.ReportsClient {
	c.t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, certFile)
	if err != nil {
		c.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pemBytes, _ := os.ReadFile(c.serverCA.File)
	pool.AppendCertsFromPEM(pemBytes)
	conn, err := grpc.NewClient(c.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool})))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return v1.NewReportsClient(conn)
}

func report1(node string, seq uint64, sets ...status.Set) *v1.NodeReport {
	return v1.FromStatus(status.Node{Node: status.NodeInfo{Name: node}, Sets: sets}, "boot-a", seq, time.Minute)
}

func TestIdentityOrderingAndLimits(t *testing.T) {
	c := newCluster(t, Limits{MaxNodes: 2, MaxSetsPerReport: 5, MaxImagesPerSetList: 10, MaxStringLength: 1024})
	certW1, _ := c.kubeletCA.Node(c.dir, "w1")
	w1 := c.rawClient(certW1)
	ctx := context.Background()
	if ack, err := w1.Report(ctx, report1("w1", 10, set("s", status.Ready, 1, 1))); err != nil || !ack.GetAccepted() {
		t.Fatalf("%v %v", ack, err)
	}

	// A node reports only for itself.
	_, err := w1.Report(ctx, report1("w2", 11, set("s", status.Failed, 0, 1)))
	if grpcstatus.Code(err) != codes.PermissionDenied {
		t.Fatalf("spoof: %v", err)
	}
	if _, _, ok := c.store.Node("w2"); ok {
		t.Fatal("a spoofed report created a node")
	}

	// Older and repeated reports of the same boot are ignored; a new boot is newer.
	if ack, _ := w1.Report(ctx, report1("w1", 9, set("s", status.Failed, 0, 1))); ack.GetAccepted() {
		t.Fatal("an older report was accepted")
	}
	newBoot := report1("w1", 1, set("s", status.Pulling, 0, 1))
	newBoot.BootId = "boot-b"
	if ack, _ := w1.Report(ctx, newBoot); !ack.GetAccepted() {
		t.Fatal("a report of a new boot was refused")
	}

	// Bad reports: a clear error, nothing changed.
	before, _ := c.store.Set("s", true)
	for name, r := range map[string]*v1.NodeReport{
		"too many sets": report1("w1", 20, set("a", status.Ready, 1, 1), set("b", status.Ready, 1, 1), set("c", status.Ready, 1, 1),
			set("d", status.Ready, 1, 1), set("e", status.Ready, 1, 1), set("f", status.Ready, 1, 1)),
		"bad phase":      report1("w1", 21, status.Set{Name: "s", Phase: "Done"}),
		"bad set name":   report1("w1", 22, status.Set{Name: "../x", Phase: status.Ready}),
		"more ready":     report1("w1", 23, status.Set{Name: "s", Phase: status.Ready, ImagesReady: 2, ImagesTotal: 1}),
		"long message":   report1("w1", 24, status.Set{Name: "s", Phase: status.Ready, Conditions: []status.Condition{{Message: strings.Repeat("x", 2000)}}}),
		"duplicate sets": report1("w1", 25, set("s", status.Ready, 1, 1), set("s", status.Ready, 1, 1)),
	} {
		_, err := w1.Report(ctx, r)
		if grpcstatus.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", name, err)
		}
	}
	if after, _ := c.store.Set("s", true); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a bad report changed the store:\n%+v\n%+v", before, after)
	}
	// Oversized on the wire.
	big := report1("w1", 30, set("s", status.Ready, 1, 1))
	big.Faults = []string{strings.Repeat("x", MaxReportBytes+1)}
	if _, err := w1.Report(ctx, big); grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized: %v", err)
	}

	// The node limit.
	certW2, _ := c.kubeletCA.Node(c.dir, "w2")
	certW3, _ := c.kubeletCA.Node(c.dir, "w3")
	if _, err := c.rawClient(certW2).Report(ctx, report1("w2", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.rawClient(certW3).Report(ctx, report1("w3", 1)); grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("node limit: %v", err)
	}

	// Certificates that are not a node's, or not from the kubelet client CA.
	notNode, _ := c.kubeletCA.Client(c.dir, "admin", "admin", "system:masters")
	if _, err := c.rawClient(notNode).Report(ctx, report1("admin", 1)); grpcstatus.Code(err) != codes.Unauthenticated {
		t.Fatalf("non-node certificate: %v", err)
	}
	otherCA, _ := testcerts.NewCA(c.dir, "other-ca")
	foreign, _ := otherCA.Node(c.dir, "w1-foreign")
	if _, err := c.rawClient(foreign).Report(ctx, report1("w1-foreign", 1)); err == nil || grpcstatus.Code(err) == codes.OK {
		t.Fatal("a certificate from another CA was accepted")
	}
}

func TestExpectedNodesAndETA(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewStore(DefaultLimits(), func() time.Time { return now })
	s.SetExpected(ReadExpectedNodes([]byte("w1\n# comment\nw2 # the second\n\n")))
	p := set("s", status.Pulling, 10, 110)
	p.BytesTotal, p.BytesReady = 1100, 100
	if _, err := s.Ingest("w1", report1("w1", 1, p)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(10 * time.Second)
	p.ImagesReady, p.BytesReady = 20, 200
	if _, err := s.Ingest("w1", report1("w1", 2, p)); err != nil {
		t.Fatal(err)
	}
	v, _ := s.Set("s", true)
	// 100 bytes in 10 s, 900 to go: 90 s.
	if v.ETASeconds == nil || *v.ETASeconds != 90 {
		t.Fatalf("eta %v", v.ETASeconds)
	}
	if v.Ready || v.Targeted != 2 || v.UnknownNodes != 1 || v.Nodes[1].Reason != "NeverReported" {
		t.Fatalf("expected w2 must hold the set back: %+v", v)
	}
	nodes := s.Nodes()
	if len(nodes) != 2 || !nodes[1].NeverReported {
		t.Fatalf("%+v", nodes)
	}
}

// The RegistryIndependent condition a node reports, and its node-local part
// (PodsStartWithoutRegistry), through the gRPC conversions, are rolled up per set:
// counted when True; a Ready node whose own pods start counts in PodsStartNodes though
// too few nodes hold its blobs (BlobHolders says that); the others are named (first by
// name) on Ready nodes, with their own reason, not the count of holders'. A node that
// does not say whether its own pods start (an older imagepind) is not taken to.
func TestRollupRegistryIndependent(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewStore(DefaultLimits(), func() time.Time { return now })
	with := func(st status.Set, c status.Condition, own ...status.Condition) status.Set {
		c.Type = status.ConditionRegistryIndependent
		st.Conditions = append(st.Conditions, c)
		for _, o := range own {
			o.Type = status.ConditionPodsStartWithoutRegistry
			st.Conditions = append(st.Conditions, o)
		}
		return st
	}
	stranded := status.Condition{Status: status.False, Reason: status.ReasonBlobsNotHeld, Message: "1 of the 5 blobs … held by fewer than 2 nodes"}
	reports := map[string]status.Set{
		"w1": with(set("s", status.Ready, 2, 2), status.Condition{Status: status.True, Reason: status.ReasonPodsStartWithoutRegistry}),
		"w3": with(set("s", status.Ready, 2, 2), status.Condition{Status: status.False, Reason: status.ReasonCredentialVerification, Message: "AlwaysVerify"},
			status.Condition{Status: status.False, Reason: status.ReasonCredentialVerification, Message: "AlwaysVerify"}),
		"w2": set("s", status.Ready, 2, 2), // an older imagepind: no condition
		"w4": with(set("s", status.Pulling, 1, 2), status.Condition{Status: status.False, Reason: status.ReasonNotReady}),
		"w5": with(set("s", status.Ready, 2, 2), stranded, status.Condition{Status: status.True, Reason: status.ReasonImagesHeld}),
		"w6": with(set("s", status.Ready, 2, 2), stranded, status.Condition{Status: status.Unknown, Reason: status.ReasonCredentialVerification, Message: "the gate not known"}),
		"w7": with(set("s", status.Ready, 2, 2), stranded), // an imagepind that does not say its own part
	}
	for node, st := range reports {
		if _, err := s.Ingest(node, report1(node, 1, st)); err != nil {
			t.Fatal(err)
		}
	}
	v, ok := s.Set("s", false)
	if !ok {
		t.Fatal("no view")
	}
	var got []string
	for _, n := range v.RegistryDependent {
		got = append(got, n.Node+" "+n.Status+" "+n.Reason)
	}
	want := []string{"w2 Unknown NotReported", "w3 False CredentialVerification", "w6 Unknown CredentialVerification", "w7 Unknown NotReported"}
	if v.RegistryIndependentNodes != 1 || v.PodsStartNodes != 2 || v.RegistryDependentNodes != 4 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("view: independent %d, pods start on %d, dependent %d %q; want 1, 2, 4 %q", v.RegistryIndependentNodes, v.PodsStartNodes, v.RegistryDependentNodes, got, want)
	}
	if m := v.RegistryDependent[3].Message; !strings.Contains(m, "does not report whether its own pods start") || !strings.Contains(m, stranded.Message) {
		t.Fatalf("the older node's words: %q", m)
	}
}
