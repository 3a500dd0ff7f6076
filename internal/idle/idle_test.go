package idle

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// exeRSS is the resident kB of this executable's read-only mappings (/proc/self/smaps).
func exeRSS(t *testing.T) int {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Skip("no /proc/self/exe")
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip("no /proc/self/smaps")
	}
	defer f.Close()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") {
			in = len(fields) >= 6 && fields[5] == exe && !strings.Contains(fields[1], "w")
			continue
		}
		if in && len(fields) >= 2 && fields[0] == "Rss:" {
			kb, _ := strconv.Atoi(fields[1])
			total += kb
		}
	}
	return total
}

// Trim pages out the executable's code: its resident size drops (the test goes on
// running the same code afterwards: the kernel reads the pages back).
func TestTrimPagesOutTheExecutable(t *testing.T) {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	// MADV_PAGEOUT is Linux 5.4; older kernels answer EINVAL and Trim does nothing.
	if err := unix.Madvise(make([]byte, os.Getpagesize()), unix.MADV_PAGEOUT); err != nil {
		t.Skipf("kernel %s has no MADV_PAGEOUT: %v", unix.ByteSliceToString(uts.Release[:]), err)
	}
	before := exeRSS(t)
	Trim()
	after := exeRSS(t)
	t.Logf("executable resident: %d kB before Trim, %d kB after", before, after)
	if before == 0 || after*2 > before {
		t.Fatalf("executable resident %d kB after Trim, %d kB before: expected it at least halved", after, before)
	}
}
