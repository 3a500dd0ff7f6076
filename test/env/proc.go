package env

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// RSSKiB is a process's resident set size (VmRSS) in KiB; 0 when it cannot be read.
func RSSKiB(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			n, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return n
		}
	}
	return 0
}
