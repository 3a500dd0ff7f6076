package main

import (
	"fmt"
	"time"

	"github.com/imagepin/imagepin/test/goals"
)

// cpuUse is the CPU a run used: the registry's, the runtime's and imagepind's (user +
// system), and the machine's busy share over the run. On a machine of few cores a pull
// method that costs more CPU than another costs time too: the columns tell which
// process it went to.
type cpuUse struct {
	registry, runtime, imagepind time.Duration
	busy                         float64 // the machine's busy share, 0..1
}

// cpuMark is the counters at a run's start.
type cpuMark struct {
	registry, runtime  int64
	busy, all          int64
	registryPID, rtPID int
}

func markCPU(registryPID, runtimePID int) cpuMark {
	m := cpuMark{registryPID: registryPID, rtPID: runtimePID}
	m.registry, _ = cpuTicks(registryPID)
	m.runtime, _ = cpuTicks(runtimePID)
	m.busy, m.all = goals.MachineCPU()
	return m
}

// since is the CPU used since m; imagepind's is measured by its run (daemon's ticks).
func (m cpuMark) since(imagepind time.Duration) cpuUse {
	r, _ := cpuTicks(m.registryPID)
	rt, _ := cpuTicks(m.rtPID)
	busy, all := goals.MachineCPU()
	u := cpuUse{registry: ticks(r - m.registry), runtime: ticks(rt - m.runtime), imagepind: imagepind}
	if all > m.all {
		u.busy = float64(busy-m.busy) / float64(all-m.all)
	}
	return u
}

// ticks are clock ticks (USER_HZ, 100 on Linux) as a duration.
func ticks(n int64) time.Duration { return time.Duration(n) * 10 * time.Millisecond }

// cpuColumn is the medians of runs' CPU: registry / runtime / imagepind seconds, and
// the machine's busy share.
func cpuColumn(us []cpuUse) string {
	if len(us) == 0 {
		return ""
	}
	var reg, rt, ipd []time.Duration
	var busy []float64
	for _, u := range us {
		reg, rt, ipd = append(reg, u.registry), append(rt, u.runtime), append(ipd, u.imagepind)
		busy = append(busy, u.busy)
	}
	ipdCol := "—"
	if median(ipd) > 0 {
		ipdCol = fmt.Sprintf("%.2f", median(ipd).Seconds())
	}
	return fmt.Sprintf("%.2f / %.2f / %s | %.0f %%", median(reg).Seconds(), median(rt).Seconds(), ipdCol, 100*goals.Median(busy))
}
