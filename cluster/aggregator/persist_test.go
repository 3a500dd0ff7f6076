package aggregator

import (
	"context"
	"io"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/status"
)

func TestPersistenceRestoresThePage(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	path := filepath.Join(t.TempDir(), "reports.db")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s1 := NewStore(DefaultLimits(), clock)
	p1, err := OpenPersister(path, s1, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	for i, node := range []string{"w1", "w2"} {
		if _, err := s1.Ingest(node, report1(node, uint64(10+i), set("s", status.Ready, 2, 2), set("t", status.Failed, 1, 2))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p1.Run(ctx) }()
	cancel() // shutdown flushes
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A new aggregator: the page is populated at once.
	s2 := NewStore(DefaultLimits(), clock)
	p2, err := OpenPersister(path, s2, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.db.Close()
	n, err := p2.Load()
	if err != nil || n != 2 {
		t.Fatalf("loaded %d: %v", n, err)
	}
	if !reflect.DeepEqual(s1.Sets(), s2.Sets()) {
		t.Fatalf("restored rollup differs:\n%+v\n%+v", s1.Sets(), s2.Sets())
	}
	// Heartbeats stay the truth: an older report of the same boot is still refused, and a
	// silent node goes Unknown after 3 of its heartbeats from its last real report.
	if ok, _ := s2.Ingest("w1", report1("w1", 9, set("s", status.Failed, 0, 2))); ok {
		t.Fatal("an older report replaced a restored one")
	}
	now = now.Add(4 * time.Minute)
	if v, _ := s2.Set("s", true); v.UnknownNodes != 2 {
		t.Fatalf("restored nodes must go Unknown when silent: %+v", v)
	}
	// Nothing to flush: no write.
	if dirty := s2.takeDirty(); len(dirty) != 0 {
		t.Fatalf("dirty after load: %v", dirty)
	}
}

// Nodes that stop reporting are forgotten after the horizon, from memory and from the
// state file; a restart does not make an old report young again; a node the cluster
// deleted is forgotten once it is Unknown, and one that still reports is kept.
func TestForgetSilentAndDeletedNodes(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	path := filepath.Join(t.TempDir(), "reports.db")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	limits := DefaultLimits()
	limits.MaxNodes = 2
	s1 := NewStore(limits, clock)
	p1, err := OpenPersister(path, s1, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"old", "live"} {
		if _, err := s1.Ingest(node, report1(node, 1, set("s", status.Ready, 1, 1))); err != nil {
			t.Fatal(err)
		}
	}
	if err := p1.Flush(); err != nil {
		t.Fatal(err)
	}
	now = now.Add(20 * time.Hour)
	if _, err := s1.Ingest("live", report1("live", 2, set("s", status.Ready, 1, 1))); err != nil {
		t.Fatal(err)
	}
	if err := p1.Flush(); err != nil {
		t.Fatal(err)
	}
	p1.db.Close()

	// A restart 5 hours later: "old" has been silent for 25 h, past a 24 h horizon.
	now = now.Add(5 * time.Hour)
	s2 := NewStore(limits, clock)
	p2, err := OpenPersister(path, s2, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p2.Load(); err != nil || n != 2 {
		t.Fatalf("loaded %d: %v", n, err)
	}
	if gone := s2.Forget(24*time.Hour, nil); !reflect.DeepEqual(gone, []string{"old"}) {
		t.Fatalf("forgot %v", gone)
	}
	if err := p2.Flush(); err != nil {
		t.Fatal(err)
	}
	if v, _ := s2.Set("s", true); v.Targeted != 1 || len(s2.Nodes()) != 1 {
		t.Fatalf("after forgetting: %+v, nodes %+v", v, s2.Nodes())
	}
	// The slot is free again (max 2 nodes).
	if _, err := s2.Ingest("new", report1("new", 1, set("s", status.Ready, 1, 1))); err != nil {
		t.Fatal(err)
	}
	p2.db.Close()
	s3 := NewStore(limits, clock)
	p3, err := OpenPersister(path, s3, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p3.db.Close()
	if n, _ := p3.Load(); n != 1 {
		t.Fatalf("the forgotten node came back from the state file: %d reports", n)
	}

	// The cluster no longer has "live": kept while it reports, forgotten once Unknown.
	// (Restored, its last report was 5 h old: Unknown, until it reports again.)
	if _, err := s2.Ingest("live", report1("live", 3, set("s", status.Ready, 1, 1))); err != nil {
		t.Fatal(err)
	}
	if gone := s2.Forget(0, map[string]bool{"new": true}); len(gone) != 0 {
		t.Fatalf("a node that still reports was forgotten: %v", gone)
	}
	now = now.Add(10 * time.Minute)
	if _, err := s2.Ingest("new", report1("new", 2, set("s", status.Ready, 1, 1))); err != nil {
		t.Fatal(err)
	}
	if gone := s2.Forget(0, map[string]bool{"new": true}); !reflect.DeepEqual(gone, []string{"live"}) {
		t.Fatalf("forgot %v", gone)
	}
}

// A restarted aggregator (the shipped manifests keep --state-file across a container
// restart) must not take restored reports for live ones: a report 20 h old is Unknown,
// not Ready, and no restored node counts as reported for the new leader's warm-up until
// it reports live. Before the fix the restored reports counted as received at the
// restart: the warm-up was skipped and the status said Ready 3/3 for silent nodes.
func TestRestoredReportsAreNotLive(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	path := filepath.Join(t.TempDir(), "reports.db")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s1 := NewStore(DefaultLimits(), clock)
	p1, err := OpenPersister(path, s1, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"w1", "w2", "w3"} {
		if _, err := s1.Ingest(node, report1(node, 1, set("s", status.Ready, 1, 1))); err != nil {
			t.Fatal(err)
		}
	}
	if err := p1.Flush(); err != nil {
		t.Fatal(err)
	}
	p1.db.Close()

	now = now.Add(20 * time.Hour)
	s2 := NewStore(DefaultLimits(), clock)
	p2, err := OpenPersister(path, s2, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.db.Close()
	if n, err := p2.Load(); err != nil || n != 3 {
		t.Fatalf("loaded %d: %v", n, err)
	}
	s2.SetTargets(map[string]Target{"s": {Nodes: []string{"w1", "w2", "w3"}}})
	v, _ := s2.Set("s", true)
	if v.Ready || v.ReadyNodes != 0 || v.UnknownNodes != 3 {
		t.Fatalf("20 h old reports rolled up as %d/%d ready, %d unknown", v.ReadyNodes, v.Targeted, v.UnknownNodes)
	}
	for _, n := range []string{"w1", "w2", "w3"} {
		if s2.Reported(n) {
			t.Fatalf("%s counts as reported from the state file", n)
		}
	}
	if _, err := s2.Ingest("w1", report1("w1", 2, set("s", status.Ready, 1, 1))); err != nil {
		t.Fatal(err)
	}
	if !s2.Reported("w1") || s2.Reported("w2") {
		t.Fatal("a live report must count, and only for its node")
	}
	if v, _ := s2.Set("s", true); v.ReadyNodes != 1 || v.UnknownNodes != 2 {
		t.Fatalf("after one live report: %+v", v)
	}
	// The restored report's receive time is kept when it is flushed again.
	if dirty := s2.takeDirty(); !dirty["w1"].received.Equal(now) || len(dirty) != 1 {
		t.Fatalf("dirty %v", dirty)
	}
}
