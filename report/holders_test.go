package report

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/testcerts"
)

// tablesAggregator keeps the tables of blobs it was sent, asks for one it lacks, and
// answers every set with count.
type tablesAggregator struct {
	v1.UnimplementedReportsServer
	count status.BlobHolders

	mu     sync.Mutex
	tables map[string]bool
	// sent says, report by report, whether it carried its table.
	sent []bool
}

func (a *tablesAggregator) Report(_ context.Context, r *v1.NodeReport) (*v1.ReportAck, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := r.GetBlobs()
	a.sent = append(a.sent, b.GetTable() != nil)
	if b.GetTable() != nil {
		a.tables[string(b.GetTableId())] = true
	}
	ack := &v1.ReportAck{Accepted: true, WantBlobTable: !a.tables[string(b.GetTableId())]}
	for _, s := range r.GetSets() {
		ack.Holders = append(ack.Holders, &v1.SetHolders{Set: s.GetName(), Holders: v1.FromHolders(a.count)})
	}
	return ack, nil
}

func (a *tablesAggregator) reports() []bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]bool(nil), a.sent...)
}

// forget drops every table, and says how many reports came before.
func (a *tablesAggregator) forget() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tables = map[string]bool{}
	return len(a.sent)
}

// A node sends its table of blobs until the aggregator has it, then its id and bitmaps
// alone; an aggregator that lost it (restarted) asks, and gets it in the next report,
// sent at once. The count it answers per set reaches Holders and OnHolders; once no
// answer came for three heartbeats it is not used: Unknown, saying since when.
func TestTheTableOfBlobsIsSentOnceAndTheCountKeptWhileFresh(t *testing.T) {
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
	count := status.BlobHolders{Status: status.False, Images: 1, Blobs: 2, ShortCount: 1, Short: []status.ShortBlob{
		{Digest: "sha256:" + strings.Repeat("2", 64), Image: "reg.example/a@sha256:" + strings.Repeat("a", 64), Size: 10, Holders: []string{"w1"}, Pinners: 2}}}
	agg := &tablesAggregator{count: count, tables: map[string]bool{}}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{kp}})))
	v1.RegisterReportsServer(s, agg)
	go s.Serve(l)
	defer s.Stop()

	var calls atomic.Int64
	heartbeat := 300 * time.Millisecond
	r := New(Config{Aggregator: l.Addr().String(), CertFile: nodeCert, CAFile: ca.File, Heartbeat: heartbeat,
		OnHolders: func() { calls.Add(1) }}, logrus.New())
	if h := r.Holders("app"); h.Status != status.Unknown || h.Unknown != "no answer from the aggregator yet" {
		t.Fatalf("before any answer: %+v", h)
	}
	node := func(held bool) status.Node {
		return status.Node{Node: status.NodeInfo{Name: "w1"}, Sets: []status.Set{{Name: "app", Phase: status.Ready}},
			Blobs: []status.ImageBlobs{{Image: "reg.example/a@sha256:" + strings.Repeat("a", 64), Sets: []string{"app"}, Blobs: []status.Blob{
				{Digest: "sha256:" + strings.Repeat("1", 64), Size: 5, Held: true}, {Digest: "sha256:" + strings.Repeat("2", 64), Size: 10, Held: held}}}}}
	}
	r.Update(node(false))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: reports %v", what, agg.reports())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("the first answer", func() bool { return calls.Load() == 1 })
	if h := r.Holders("app"); h.Status != status.False || h.ShortCount != 1 || h.Short[0].Holders[0] != "w1" {
		t.Fatalf("the answer: %+v", h)
	}
	if h := r.Holders("other"); h.Status != status.Unknown || h.Unknown != "the aggregator has not counted this set yet" {
		t.Fatalf("a set not counted: %+v", h)
	}

	r.Update(node(true)) // the store filled a blob: the same table, other bits
	waitFor("the second report", func() bool { return len(agg.reports()) >= 2 })
	k := agg.forget() // the aggregator restarted without it
	r.Update(node(false))
	waitFor("the table sent again", func() bool { return len(agg.reports()) >= k+2 })
	// The first report carried it, then none until the aggregator asked (report k), and
	// the next one did.
	got := agg.reports()
	for i, sent := range got[:k+2] {
		if sent != (i == 0 || i == k+1) {
			t.Fatalf("tables sent %v (the aggregator forgot them after %d); want the first report's and the one after it asked", got, k)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("OnHolders called %d times for one count", calls.Load())
	}

	s.Stop() // no answer for three heartbeats
	waitFor("the count dropped", func() bool { return calls.Load() == 2 })
	if h := r.Holders("app"); h.Status != status.Unknown || !strings.HasPrefix(h.Unknown, "no answer from the aggregator since ") {
		t.Fatalf("an old count used: %+v", h)
	}
}

// A node pinning so many images that its table of blobs would make the report too
// large for the aggregator still reports its status, without the blobs; its sets'
// count is Unknown, saying so.
func TestATableTooLargeIsLeftOutOfTheReport(t *testing.T) {
	var images []status.ImageBlobs
	for i := range 8000 {
		img := status.ImageBlobs{Image: fmt.Sprintf("reg.example/team/image-%05d@sha256:%064x", i, i), Sets: []string{"big"}}
		for j := range 10 {
			img.Blobs = append(img.Blobs, status.Blob{Digest: fmt.Sprintf("sha256:%060x%04x", i, j), Size: 1 << 20})
		}
		images = append(images, img)
	}
	r := New(Config{Heartbeat: time.Second}, logrus.New())
	report := v1.FromStatus(status.Node{Node: status.NodeInfo{Name: "w1"}, Sets: []status.Set{{Name: "big"}}, Blobs: images}, "boot", 1, time.Second)
	r.boundTable(report)
	if report.GetBlobs() != nil || len(report.GetSets()) != 1 {
		t.Fatalf("blobs %v, sets %d", report.GetBlobs() != nil, len(report.GetSets()))
	}
	if h := r.Holders("big"); h.Status != status.Unknown || !strings.Contains(h.Unknown, "is too large to send to the aggregator") {
		t.Fatalf("%+v", h)
	}
	small := v1.FromStatus(status.Node{Node: status.NodeInfo{Name: "w1"}, Blobs: images[:10]}, "boot", 2, time.Second)
	if r.boundTable(small); small.GetBlobs() == nil || strings.Contains(r.Holders("big").Unknown, "too large") {
		t.Fatal("a table that fits is left out, or still said too large")
	}
}
