package idle

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeProcess is a process's CPU time and resident bytes that a test moves; a trim
// brings the resident bytes back to base.
type fakeProcess struct {
	mu    sync.Mutex
	cpu   time.Duration
	rss   int64
	busy  bool // a second of CPU more at every look
	trims int
	at    []time.Time // when each trim was
}

const base = 10 << 20

func (p *fakeProcess) work(cpu time.Duration, grow int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cpu += cpu
	p.rss += grow
}

func (p *fakeProcess) setBusy(b bool) { p.mu.Lock(); p.busy = b; p.mu.Unlock() }

func (p *fakeProcess) trimmer() *Trimmer {
	return &Trimmer{Every: time.Millisecond, Quiet: 10 * time.Millisecond, Grown: 2 << 20, MinGap: time.Millisecond,
		Trim: func() {
			p.mu.Lock()
			p.trims++
			p.at = append(p.at, time.Now())
			p.rss = base
			p.mu.Unlock()
		},
		CPU: func() time.Duration {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.busy {
				p.cpu += time.Second
			}
			return p.cpu
		},
		RSS: func() int64 { p.mu.Lock(); defer p.mu.Unlock(); return p.rss },
	}
}

func (p *fakeProcess) count() int { p.mu.Lock(); defer p.mu.Unlock(); return p.trims }

// waitTrims waits up to 5 s for n trims.
func (p *fakeProcess) waitTrims(t *testing.T, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.count() < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := p.count(); got != n {
		t.Fatalf("%s: %d trims, want %d", what, got, n)
	}
}

// stays checks that no trim comes for many looks.
func (p *fakeProcess) stays(t *testing.T, n int, what string) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	if got := p.count(); got != n {
		t.Fatalf("%s: %d trims, want %d", what, got, n)
	}
}

// The Trimmer trims when told, and after work it was not told of once the process is
// quiet again and has grown; an idle process is trimmed once, not at every look.
func TestTrimmerTrimsWhatUntoldWorkLeftOnceQuiet(t *testing.T) {
	p := &fakeProcess{rss: base}
	tr := p.trimmer()
	tr.Settled()
	if n := p.count(); n != 1 {
		t.Fatalf("%d trims after Settled, want 1", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	p.stays(t, 1, "idle after Settled")
	p.work(time.Second, 1<<20) // grown too little to be worth a trim
	p.stays(t, 1, "grown 1 MiB")
	p.work(50*time.Millisecond, 17<<20) // serving peers: the TLS and mirror code paged in
	p.waitTrims(t, 2, "grown 18 MiB, then quiet")
	p.stays(t, 2, "idle again")
	cancel()
	<-done
}

// A process busy at every look is not trimmed until it is quiet; nor within MinGap of
// the last trim.
func TestTrimmerWaitsForQuietAndMinGap(t *testing.T) {
	p := &fakeProcess{rss: base}
	tr := p.trimmer()
	tr.MinGap = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.setBusy(true)
	p.work(0, 20<<20)
	go tr.Run(ctx)
	p.stays(t, 0, "busy")
	p.setBusy(false)
	p.waitTrims(t, 1, "quiet")
	p.work(0, 20<<20)
	p.waitTrims(t, 2, "grown again")
	p.mu.Lock()
	defer p.mu.Unlock()
	if gap := p.at[1].Sub(p.at[0]); gap < 100*time.Millisecond {
		t.Fatalf("trimmed again %s after the last trim: MinGap is 100 ms", gap)
	}
}
