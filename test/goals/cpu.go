package goals

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// MachineCPU are the machine's busy and total CPU ticks so far (/proc/stat: all but
// idle and iowait are busy); a run's busy share is the ratio of their increases.
func MachineCPU() (busy, all int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		all += v
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, all
}

// Median is the median of xs (the lower of the two middle values; 0 for none): a busy
// share, or any figure measured over runs.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[(len(s)-1)/2]
}
