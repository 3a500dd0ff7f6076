package report

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"

	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/testcerts"
)

// A client certificate missing at start (a fresh node, its CSR not approved yet) does
// not switch reporting off: once the file appears, the reporter goes on to report.
func TestMissingCertificateIsWaitedFor(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "w1.pem") // where testcerts writes it below
	ca, err := testcerts.NewCA(dir, "kubelet-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	r := New(Config{Aggregator: "127.0.0.1:1", CertFile: cert, Heartbeat: 200 * time.Millisecond}, log)
	r.Update(status.Node{Node: status.NodeInfo{Name: "w1"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	select {
	case err := <-done:
		t.Fatalf("Run gave up on a missing certificate: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if !logged(hook, "cannot report yet; retrying until the certificate is there") {
		t.Fatal("the wait is not logged")
	}
	if _, err := ca.Node(dir, "w1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !logged(hook, "report failed; retrying with the latest status") { // nothing listens on port 1
		if time.Now().After(deadline) {
			t.Fatal("the reporter did not go on once the certificate appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !logged(hook, "report client certificate available") {
		t.Fatal("the certificate's arrival is not logged")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func logged(hook *test.Hook, msg string) bool {
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, msg) {
			return true
		}
	}
	return false
}

// An aggregator that is gone for a while (a leader killed, its standby not taking
// reports yet) is reported to again within about a heartbeat of its return: gRPC's own
// redial backoff (up to 120 s) must not outlast the new leader's warm-up (1.5 heartbeats).
func TestReportsResumeWithinAHeartbeatOfTheAggregatorsReturn(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := ca.Server(dir, "aggregator")
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, err := ca.Node(dir, "w1")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	agg := &countingAggregator{}
	serve := func(l net.Listener) *grpc.Server {
		kp, err := tls.LoadX509KeyPair(srvCert, srvKey)
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}})))
		v1.RegisterReportsServer(s, agg)
		go s.Serve(l)
		return s
	}
	srv := serve(l)
	heartbeat := 500 * time.Millisecond
	r := New(Config{Aggregator: addr, CertFile: nodeCert, CAFile: ca.File, Heartbeat: heartbeat}, logrus.New())
	r.Update(status.Node{Node: status.NodeInfo{Name: "w1"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	waitReports := func(n int64, within time.Duration) time.Duration {
		start := time.Now()
		for agg.n.Load() < n {
			if time.Since(start) > within {
				t.Fatalf("%d reports after %s, want %d", agg.n.Load(), within, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return time.Since(start)
	}
	waitReports(1, 5*time.Second)
	// Gone for 10 s: gRPC's default redials (1, 1.6, 2.6, 4.1, 6.6 s apart, ±20%) would
	// come back 2.6 s after the return at the earliest; a heartbeat apart, within 1.2 s,
	// and the report follows within a heartbeat more.
	srv.Stop()
	time.Sleep(10 * time.Second)
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	before := agg.n.Load()
	srv = serve(l)
	defer srv.Stop()
	took := waitReports(before+1, 2200*time.Millisecond)
	t.Logf("reporting again %s after the aggregator's return", took.Round(time.Millisecond))
}

type countingAggregator struct {
	v1.UnimplementedReportsServer
	n atomic.Int64
}

func (a *countingAggregator) Report(context.Context, *v1.NodeReport) (*v1.ReportAck, error) {
	a.n.Add(1)
	return &v1.ReportAck{}, nil
}

type peersAggregator struct {
	v1.UnimplementedReportsServer
}

func (peersAggregator) Report(context.Context, *v1.NodeReport) (*v1.ReportAck, error) {
	return &v1.ReportAck{Accepted: true, Peers: []string{"10.0.0.1:7444", "10.0.0.2:7444"}}, nil
}

// The peers an answer carries reach OnPeers.
func TestAnswersCarryPeers(t *testing.T) {
	dir := t.TempDir()
	ca, _ := testcerts.NewCA(dir, "ca")
	srvCert, srvKey, _ := ca.Server(dir, "aggregator")
	nodeCert, _ := ca.Node(dir, "w1")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}})))
	v1.RegisterReportsServer(s, peersAggregator{})
	go s.Serve(l)
	defer s.Stop()
	got := make(chan []string, 1)
	r := New(Config{Aggregator: l.Addr().String(), CertFile: nodeCert, CAFile: ca.File, Heartbeat: time.Second,
		OnPeers: func(p []string) {
			select {
			case got <- p:
			default:
			}
		}}, logrus.New())
	r.Update(status.Node{Node: status.NodeInfo{Name: "w1"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	select {
	case p := <-got:
		if len(p) != 2 || p[1] != "10.0.0.2:7444" {
			t.Fatalf("peers %v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no peers reached OnPeers")
	}
}

// k3s and RKE2 keep the kubelet's client key apart from its certificate
// (client-kubelet.crt and .key): the reporter presents the two as one.
func TestClientKeyApart(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "kubelet-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	combined, err := ca.Node(dir, "w1")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := testcerts.SplitKey(combined)
	if err != nil {
		t.Fatal(err)
	}
	r := New(Config{Aggregator: "127.0.0.1:1", CertFile: crt, KeyFile: key, CAFile: ca.File, Heartbeat: time.Second}, logrus.New())
	cfg, err := r.tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || c.Leaf == nil || c.Leaf.Subject.CommonName != "system:node:w1" {
		t.Fatalf("client certificate: %+v, %v", c, err)
	}
	r = New(Config{Aggregator: "127.0.0.1:1", CertFile: crt, CAFile: ca.File, Heartbeat: time.Second}, logrus.New())
	if _, err := r.tlsConfig(); err == nil || !strings.Contains(err.Error(), crt) {
		t.Fatalf("a certificate without its key: %v, want an error naming %s", err, crt)
	}
}
