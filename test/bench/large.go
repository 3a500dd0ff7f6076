package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/goals"
)

var (
	largeSizes = flag.String("large-sizes", "250,1000,2000", "P6: set sizes (images)")
	largeReps  = flag.Int("large-reps", 3, "P6: repetitions of each size")
)

// large is P6: sets of up to the enhancement's 2000 images on loopback, each on a fresh
// CRI-O: imagepind's time to Ready against a raw CRI pull of the same images at the
// width imagepind may use, whether it ever shows Failed or a fault on the way, its own
// CPU time per image, and CRI-O's CPU per image (which grows with its image count).
func (b *bench) large(ctx context.Context) error {
	var sizes []int
	maxN := 0
	for _, s := range strings.Split(*largeSizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("-large-sizes: %w", err)
		}
		sizes = append(sizes, n)
		maxN = max(maxN, n)
	}
	fmt.Fprintf(os.Stderr, "pushing %d small images for P6\n", maxN)
	base, err := env.RandomLayer(4 << 10)
	if err != nil {
		return err
	}
	refs := make([]string, maxN)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var pushErr error
	sem := make(chan struct{}, 16)
	for i := range refs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			img, err := b.reg.PushRandom(ctx, fmt.Sprintf("large/img-%04d", i), 1, 4<<10, base)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				pushErr = err
				return
			}
			refs[i] = img.Ref()
		}()
	}
	wg.Wait()
	if pushErr != nil {
		return pushErr
	}
	width := conf.DefaultPullConcurrency
	type row struct {
		raw, ipd, ipdCPU, crioRawCPU, crioIpdCPU, admitted []time.Duration
		bad                                                []string
	}
	rows := map[int]*row{}
	for rep := 0; rep < *largeReps; rep++ {
		for _, n := range sizes {
			r := rows[n]
			if r == nil {
				r = &row{}
				rows[n] = r
			}
			set := refs[:n]
			// Raw CRI pulls at imagepind's widest.
			nd, err := b.freshNode(ctx, "cri-o", fmt.Sprintf("large-raw-%d-%d", n, rep))
			if err != nil {
				return err
			}
			cpu0, _ := cpuTicks(nd.crio.PID())
			d, err := criParallel(ctx, nd.socket, set, width)
			cpu1, _ := cpuTicks(nd.crio.PID())
			nd.cleanup()
			if err != nil {
				return fmt.Errorf("raw %d: %w", n, err)
			}
			r.raw = append(r.raw, d)
			r.crioRawCPU = append(r.crioRawCPU, time.Duration(cpu1-cpu0)*10*time.Millisecond)
			fmt.Fprintf(os.Stderr, "  P6 %d images: raw CRI at %d: %s\n", n, width, d.Round(time.Millisecond))

			// imagepind.
			nd, err = b.freshNode(ctx, "cri-o", fmt.Sprintf("large-ipd-%d-%d", n, rep))
			if err != nil {
				return err
			}
			dm, err := b.startDaemon(nd, fmt.Sprintf("large-d-%d-%d", n, rep), 0, "2m")
			if err != nil {
				nd.cleanup()
				return err
			}
			pid := dm.cmd.Process.Pid
			c0, _ := cpuTicks(pid)
			cr0, _ := cpuTicks(nd.crio.PID())
			start := time.Now()
			dm.writeSet("large", set)
			bad, err := watchReady(dm, "large", 30*time.Minute)
			took := time.Since(start)
			c1, _ := cpuTicks(pid)
			cr1, _ := cpuTicks(nd.crio.PID())
			dm.stop()
			nd.cleanup()
			if err != nil {
				return fmt.Errorf("imagepind %d: %w", n, err)
			}
			r.ipd = append(r.ipd, took)
			if at := firstLogTime(dm.log, "disk check admitted the set", start); at > 0 {
				r.admitted = append(r.admitted, at)
			}
			r.ipdCPU = append(r.ipdCPU, time.Duration(c1-c0)*10*time.Millisecond)
			r.crioIpdCPU = append(r.crioIpdCPU, time.Duration(cr1-cr0)*10*time.Millisecond)
			r.bad = append(r.bad, bad...)
			fmt.Fprintf(os.Stderr, "  P6 %d images: imagepind: %s (cpu %s)\n", n, took.Round(time.Millisecond), (time.Duration(c1-c0) * 10 * time.Millisecond))
		}
	}
	fmt.Printf("## P6: large sets on loopback, each on a fresh CRI-O (%d repetitions, medians)\n\n", *largeReps)
	fmt.Printf("Images of one distinct 4 KiB layer on a shared 4 KiB base. Raw: CRI PullImage %d at a time (imagepind's widest). imagepind: its default, adaptive width.\n\n", width)
	fmt.Printf("| images | raw CRI | imagepind | imagepind ÷ raw | of which the disk check, before any pull | imagepind CPU per image | CRI-O CPU per image (raw run) | CRI-O CPU per image (imagepind's run) | Failed or faults seen |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, n := range sizes {
		r := rows[n]
		bad := "none"
		if len(r.bad) > 0 {
			bad = strings.Join(r.bad[:min(3, len(r.bad))], "; ")
		}
		fmt.Printf("| %d | %.2f s | %.2f s | %.3f× | %.2f s | %.0f µs | %.2f ms | %.2f ms | %s |\n", n, median(r.raw).Seconds(), median(r.ipd).Seconds(),
			float64(median(r.ipd))/float64(median(r.raw)), median(r.admitted).Seconds(), float64(median(r.ipdCPU).Microseconds())/float64(n),
			float64(median(r.crioRawCPU).Microseconds())/1000/float64(n), float64(median(r.crioIpdCPU).Microseconds())/1000/float64(n), bad)
		b.goals.Measured(goalP6(n), goals.Measurement{Value: float64(median(r.ipd)) / float64(median(r.raw)), Detail: fmt.Sprintf("imagepind %.2f s", median(r.ipd).Seconds()),
			Baseline: fmt.Sprintf("raw CRI PullImage, %d at a time: %.2f s", width, median(r.raw).Seconds())})
	}
	fmt.Println()
	return nil
}

// watchReady polls the status until the set is Ready, noting every Failed phase or node
// fault seen on the way.
func watchReady(d *daemon, name string, timeout time.Duration) ([]string, error) {
	var bad []string
	seen := map[string]bool{}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		n, err := status.ReadFile(d.status)
		if err == nil {
			for _, f := range n.Faults {
				if !seen[f] {
					seen[f] = true
					bad = append(bad, "fault: "+f)
				}
			}
			if s := n.Set(name); s != nil {
				if s.Phase == status.Failed {
					if c := s.Condition(status.ConditionFailed); c != nil && !seen[c.Message] {
						seen[c.Message] = true
						bad = append(bad, "Failed: "+c.Reason+": "+c.Message)
					}
				}
				if s.Phase == status.Ready {
					return bad, nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return bad, fmt.Errorf("%s not Ready after %s; see %s", name, timeout, d.log)
}
