// Package idle gives memory back when a daemon settles: the Go heap's free pages, and
// the pages of its own executable it touched while busy. The executable's pages are
// file-backed and clean: the kernel drops them (MADV_PAGEOUT) and reads them back from
// the page cache, or the file, the next time the code runs. A settled imagepind then
// holds in RSS what it keeps (its state, caches, goroutines), not the code of every
// library a busy pass went through.
package idle

import (
	"bufio"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Trim returns the free heap to the system and pages out the executable's read-only
// mappings. Errors are ignored: it is advice, and an older kernel (before 5.4) does not
// know MADV_PAGEOUT.
func Trim() {
	debug.FreeOSMemory()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue
		}
		start, end, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		lo, err1 := strconv.ParseUint(start, 16, 64)
		hi, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil || hi <= lo {
			continue
		}
		unix.Syscall(unix.SYS_MADVISE, uintptr(lo), uintptr(hi-lo), unix.MADV_PAGEOUT)
	}
}
