package pullwidth

import (
	"container/heap"
	"testing"
	"time"
)

type endHeap []time.Duration

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(time.Duration)) }
func (h *endHeap) Pop() any          { old := *h; x := old[len(old)-1]; *h = old[:len(old)-1]; return x }

// sim runs n pulls of size bytes as the agent does: a pull starts whenever fewer than
// the width run and work is left, and takes dur(pulls running when it starts). A nil
// controller is a fixed width. It returns the time to the last completion and the
// width at the end.
func sim(c *Controller, fixed, n int, size int64, dur func(running int) time.Duration) (time.Duration, int) {
	width := func() int {
		if c == nil {
			return fixed
		}
		return c.Width()
	}
	var ends endHeap
	started := 0
	var now time.Duration
	fill := func() {
		for len(ends) < width() && started < n {
			heap.Push(&ends, now+dur(len(ends)+1))
			started++
		}
		if c != nil && started == n && len(ends) < width() {
			c.Unsaturated()
		}
	}
	fill()
	for len(ends) > 0 {
		now = heap.Pop(&ends).(time.Duration)
		if c != nil {
			c.Done(time.Unix(0, 0).Add(now), size)
		}
		fill()
	}
	return now, width()
}

// Links, as a pull's duration given how many run at once.
var (
	// Each connection limited (a far registry): a pull takes the same whatever runs beside it.
	perConnection = func(int) time.Duration { return 2 * time.Second }
	// A shared bottleneck worth 4 connections: beyond 4, pulls share it.
	shared4 = func(running int) time.Duration { return time.Duration(max(running, 4)) * 500 * time.Millisecond }
	// CRI-O on loopback, CPU-bound: one pull alone is slower than two, and beyond that
	// the CPU is shared.
	cpuBound = func(running int) time.Duration {
		if running == 1 {
			return 150 * time.Millisecond
		}
		return time.Duration(running) * 50 * time.Millisecond
	}
)

func bestFixed(n int, size int64, dur func(int) time.Duration, widest int) time.Duration {
	var best time.Duration
	for w := 1; w <= widest; w *= 2 {
		if d, _ := sim(nil, w, n, size, dur); best == 0 || d < best {
			best = d
		}
	}
	return best
}

// On every link, the controller is as fast as the best fixed width (within 5%) for a
// small set and a large one, and ends at a width that makes sense for the link.
func TestAsFastAsTheBestFixedWidth(t *testing.T) {
	for _, c := range []struct {
		name      string
		dur       func(int) time.Duration
		n         int
		endsAtMin int
		endsAtMax int
	}{
		{"per-connection limit, 40 images", perConnection, 40, 32, 32},
		{"per-connection limit, 2000 images", perConnection, 2000, 16, 32},
		{"shared bottleneck, 40 images", shared4, 40, 1, 32},
		{"shared bottleneck, 2000 images", shared4, 2000, 4, 8},
		{"CPU-bound, 40 images", cpuBound, 40, 1, 32},
		{"CPU-bound, 2000 images", cpuBound, 2000, 2, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			best := bestFixed(c.n, 1<<20, c.dur, 32)
			got, end := sim(New(32), 0, c.n, 1<<20, c.dur)
			if ratio := float64(got) / float64(best); ratio > 1.05 {
				t.Errorf("%s: %s against the best fixed width's %s: %.3f×", c.name, got, best, ratio)
			}
			if end < c.endsAtMin || end > c.endsAtMax {
				t.Errorf("%s: ended at width %d, want %d..%d", c.name, end, c.endsAtMin, c.endsAtMax)
			}
			t.Logf("%s: %s (best fixed %s), ends at %d", c.name, got, best, end)
		})
	}
}

// Narrowed once, a link that gets better is followed back up by the wider probes.
func TestWidensWhenTheLinkImproves(t *testing.T) {
	c := New(32)
	sim(c, 0, 2000, 1<<20, shared4)
	if c.Width() > 8 {
		t.Fatalf("width %d on the shared link", c.Width())
	}
	if _, end := sim(c, 0, 3000, 1<<20, perConnection); end != 32 {
		t.Fatalf("after the link improved: %d, want 32", end)
	}
}

// A transient error halves the width at once; rounds without enough work decide nothing.
func TestTransientHalvesAndUnsaturatedIsIgnored(t *testing.T) {
	c := New(16)
	for i, want := range []int{8, 4, 2, 1, 1} {
		c.Transient(time.Unix(int64(i), 0))
		if c.Width() != want {
			t.Fatalf("after %d errors: width %d, want %d", i+1, c.Width(), want)
		}
	}

	c = New(8)
	now := time.Unix(0, 0)
	c.Done(now, 1) // opens the first round
	for i := 0; i < 100; i++ {
		c.Unsaturated()
		now = now.Add(time.Duration(i) * time.Second)
		c.Done(now, 1)
	}
	if c.Width() != 8 {
		t.Fatalf("unsaturated rounds changed the width to %d", c.Width())
	}
}

// How far the registry is sets the start: a near one at NearWidth, a far one at the
// widest; once pulls have finished, the probes decide.
func TestLinkSetsTheStart(t *testing.T) {
	c := New(64)
	c.Link(2 * time.Millisecond)
	if c.Width() != NearWidth {
		t.Fatalf("near: %d", c.Width())
	}
	c.Link(80 * time.Millisecond)
	if c.Width() != 64 {
		t.Fatalf("far: %d", c.Width())
	}
	c.Done(time.Unix(0, 0), 1)
	c.Link(time.Millisecond)
	if c.Width() != 64 {
		t.Fatalf("after a pull finished: %d", c.Width())
	}
	if c := New(4); func() int { c.Link(time.Millisecond); return c.Width() }() != 4 {
		t.Fatal("a near start above the widest")
	}
}

// The starting width is held Hold rounds before the first probe: a 40-image set from a
// near registry is pulled 8 at once throughout, however its rounds vary.
func TestHoldsTheStartingWidthBeforeProbing(t *testing.T) {
	c := New(64)
	c.Link(time.Millisecond)
	now := time.Unix(0, 0)
	c.Done(now, 1<<20) // opens the first round
	for i := 1; i <= Hold*MinRound; i++ {
		now = now.Add(time.Duration(100+i%7*10) * time.Millisecond)
		c.Done(now, 1<<20)
		if c.Width() != NearWidth {
			t.Fatalf("after %d pulls: width %d, want the start's %d held", i, c.Width(), NearWidth)
		}
	}
	for i := 0; i < MinRound; i++ {
		now = now.Add(100 * time.Millisecond)
		c.Done(now, 1<<20)
	}
	if c.Width() != NearWidth/2 {
		t.Fatalf("after the hold: width %d, want a probe at %d", c.Width(), NearWidth/2)
	}
}
