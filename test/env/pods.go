package env

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RemovePods stops and removes every pod sandbox (and its containers) of the runtime on
// socket, as `crictl rmp -fa` does: what a kubelet started there. Each pod's monitor
// (CRI-O's conmon, containerd's shim) is a child of init, not of the runtime: stopping
// the runtime alone leaves them and their containers running after the test.
// Best effort: a runtime that does not answer has nothing to say.
func RemovePods(socket string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	exec.CommandContext(ctx, filepath.Join(CacheDir(), "crictl"), "--runtime-endpoint", "unix://"+socket,
		"--timeout", "20s", "rmp", "-fa").Run()
}

// killLeftovers kills, with SIGKILL, the processes whose command line names marker (a
// runtime's directory or socket: its conmon or shim processes) and everything below
// them (the containers they monitor). What RemovePods could not remove (the runtime
// died first) goes this way; nothing else on the machine names the test's directory.
func killLeftovers(marker string) {
	if marker == "" {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	parent := map[int]int{}
	var roots []int
	self := os.Getpid()
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == self {
			continue
		}
		if stat, err := os.ReadFile(p + "/stat"); err == nil {
			// pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 {
				if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
					parent[pid], _ = strconv.Atoi(f[1])
				}
			}
		}
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(marker)) {
			roots = append(roots, pid)
		}
	}
	kill := map[int]bool{}
	for _, r := range roots {
		kill[r] = true
	}
	for grew := true; grew; {
		grew = false
		for pid, pp := range parent {
			if kill[pp] && !kill[pid] {
				kill[pid], grew = true, true
			}
		}
	}
	for pid := range kill {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
