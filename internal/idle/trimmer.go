package idle

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Trimmer runs Trim when the daemon settles: when told (Settled: the agent's loop has
// nothing in flight and nothing due within a minute), and again, once the process is
// quiet, after work the loop does not see has made it grow. With [peers] on, the
// node-local mirror and the peers' server go on working after the agent settled
// (serving other nodes the blobs this one has, filling from them): little CPU, but
// the TLS, HTTP and mirror code it runs and the buffers it used stay resident until
// something trims again.
//
// Run looks every Every: a look that finds less than Quiet of CPU time spent since the
// one before, the resident memory Grown or more above what the last trim left, and
// MinGap passed since that trim, trims. An idle daemon neither spends nor grows: it is
// trimmed once after each burst of work and then not again. A look is one getrusage
// call and one read of /proc/self/statm.
type Trimmer struct {
	Every  time.Duration // 0: 5 s
	Quiet  time.Duration // 0: 25 ms (0.5% of a core over 5 s)
	Grown  int64         // bytes; 0: 2 MiB
	MinGap time.Duration // 0: 10 s
	// Trim gives the memory back (nil: the package's Trim); CPU is the process's CPU
	// time so far (nil: getrusage); RSS its resident bytes (nil: /proc/self/statm).
	// Tests set them.
	Trim func()
	CPU  func() time.Duration
	RSS  func() int64

	mu sync.Mutex
	// rss and at are the resident bytes right after the last trim, and when it was.
	rss int64
	at  time.Time
}

func (t *Trimmer) defaults() {
	if t.Every <= 0 {
		t.Every = 5 * time.Second
	}
	if t.Quiet <= 0 {
		t.Quiet = 25 * time.Millisecond
	}
	if t.Grown <= 0 {
		t.Grown = 2 << 20
	}
	if t.MinGap <= 0 {
		t.MinGap = 10 * time.Second
	}
	if t.Trim == nil {
		t.Trim = Trim
	}
	if t.CPU == nil {
		t.CPU = processCPU
	}
	if t.RSS == nil {
		t.RSS = residentBytes
	}
}

// Settled trims now: the agent's loop settled (agent.Deps.Idle).
func (t *Trimmer) Settled() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.defaults()
	t.trimLocked()
}

func (t *Trimmer) trimLocked() {
	t.Trim()
	t.rss, t.at = t.RSS(), time.Now()
}

// Run trims, once the process is quiet, what work since the last trim left resident,
// until ctx ends.
func (t *Trimmer) Run(ctx context.Context) error {
	t.mu.Lock()
	t.defaults()
	every := t.Every
	t.mu.Unlock()
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := t.CPU()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		t.mu.Lock()
		now := t.CPU()
		if now-last < t.Quiet && time.Since(t.at) >= t.MinGap && t.RSS()-t.rss >= t.Grown {
			t.trimLocked()
			now = t.CPU()
		}
		last = now
		t.mu.Unlock()
	}
}

// processCPU is the user and system time the process has spent.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// residentBytes is the process's resident set (/proc/self/statm's second field); 0
// when unknown, which never looks grown.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * int64(os.Getpagesize())
}
