package agent

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
)

// BenchmarkPreload is the agent's own cost of taking a set of n images to Ready against
// the in-memory runtime: what imagepind spends per image, which must stay flat as the
// set grows to the enhancement's 2000. Pulls cost nothing there, or 40 ms each (8 at
// once): a set that takes longer to pull must not cost imagepind more per image. With
// layers=shared every image is on one shared base layer (as in the large set on real
// runtimes) and pulls are ordered by layer: the first image goes alone, then the rest.
//
//	go test -run '^$' -bench Preload -benchtime 3x ./agent
func BenchmarkPreload(b *testing.B) {
	for _, c := range []struct {
		n      int
		delay  time.Duration
		shared bool
	}{{250, 0, false}, {1000, 0, false}, {2000, 0, false}, {250, 40 * time.Millisecond, false}, {1000, 40 * time.Millisecond, false}, {2000, 40 * time.Millisecond, false},
		{2000, 0, true}, {2000, 40 * time.Millisecond, true}} {
		n := c.n
		name := fmt.Sprintf("images=%d/pull=%s", n, c.delay)
		if c.shared {
			name += "/layers=shared"
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				h := newHarness(b)
				h.cfg.PullConcurrency = 8
				h.rt.PullDelay = c.delay
				var refs []string
				for j := 0; j < n; j++ {
					refs = append(refs, img(fmt.Sprintf("bench/app-%d", j), j))
				}
				h.available(refs...)
				if c.shared {
					layers := map[string][]string{}
					for j, ref := range refs {
						layers[ref] = []string{"sha256:base", fmt.Sprintf("sha256:own-%d", j)}
					}
					h.disk = &layerDisk{layers: layers}
					h.cfg.OrderByLayers = true
				}
				h.start()
				b.StartTimer()
				start, cpu0 := time.Now(), cpuTime()
				h.writeFile("big.yaml", setDoc("big", refs...))
				deadline := time.Now().Add(5 * time.Minute)
				for !phase("big", status.Ready)(h.latestStatus()) {
					if time.Now().After(deadline) {
						b.Fatalf("not Ready: %+v", h.latestStatus().Sets)
					}
					time.Sleep(time.Millisecond)
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/float64(n), "µs/image")
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(n), "cpu-µs/image")
				b.StopTimer()
				h.stop()
			}
		})
	}
}

// cpuTime is the process's CPU time (user + system): the agent's, the in-memory
// runtime's and the harness's together.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
