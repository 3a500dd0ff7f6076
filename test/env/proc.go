package env

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopProc stops a child process started by this package: SIGTERM, then SIGKILL after
// 15 s; exit is closed when it has been waited for.
func stopProc(cmd *exec.Cmd, exit chan struct{}) {
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exit:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-exit
	}
}

// logTail is the last n lines of a log file (its error, when it cannot be read).
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// RSSKiB is a process's resident set size (VmRSS) in KiB; 0 when it cannot be read.
func RSSKiB(pid int) int64 { return statusKiB(pid, "VmRSS:") }

// RSSParts is the resident memory of pid by kind (KiB): anonymous (heap, stacks) and
// file-backed (the binary's pages it touched).
func RSSParts(pid int) (anon, file int64) {
	return statusKiB(pid, "RssAnon:"), statusKiB(pid, "RssFile:")
}

func statusKiB(pid int, field string) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field) {
			n, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return n
		}
	}
	return 0
}
