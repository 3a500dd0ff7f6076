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
	// silent node goes Unknown after 3 of its heartbeats from the restart.
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
