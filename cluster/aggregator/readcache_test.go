package aggregator

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A view is computed once, served from the cache while fresh, and once stale served as
// it is while one recomputation runs beside: readers never wait for it.
func TestReadCacheServesStaleWhileRecomputing(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(0, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var computes atomic.Int32
	release := make(chan struct{})
	c := newReadCache(clock, func(key string) ([]byte, bool) {
		n := computes.Add(1)
		if n > 1 {
			<-release // a slow rollup
		}
		return []byte{byte('0' + n)}, true
	})
	if b, _ := c.get("set/a"); string(b) != "1" {
		t.Fatalf("first: %q", b)
	}
	if b, _ := c.get("set/a"); string(b) != "1" || computes.Load() != 1 {
		t.Fatalf("fresh: %q after %d computes", b, computes.Load())
	}
	mu.Lock()
	now = now.Add(ReadFreshness + time.Millisecond)
	mu.Unlock()
	done := make(chan []byte)
	go func() { b, _ := c.get("set/a"); done <- b }()
	select {
	case b := <-done:
		if string(b) != "1" {
			t.Fatalf("stale read: %q", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a reader waited for the recomputation")
	}
	for i := 0; i < 10; i++ {
		c.get("set/a") // one recomputation at a time
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, _ := c.get("set/a"); string(b) == "2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never recomputed")
		}
		time.Sleep(time.Millisecond)
	}
	if n := computes.Load(); n != 2 {
		t.Fatalf("%d computations, want 2", n)
	}
}
