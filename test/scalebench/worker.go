package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A run's nodes are spread over worker processes (-per-process nodes each), the bench
// itself keeping the registry and its link. Real nodes each have a process and a file
// table of their own; hundreds of nodes in one process share one table (20,000 files
// on this machine, a hard limit root may not raise here) and run out of it, which no
// node does. Between processes the nodes talk as before: HTTPS over loopback, one
// listener each.
//
// The bench and a worker speak over the worker's stdin and stdout, a line each:
// the bench sends the workerSpec (JSON), the worker answers "ready" once its nodes
// listen; the bench sends "go <start, Unix ns>", the worker answers "done <workerDone>"
// once its nodes hold the set or the run's time is up, and keeps serving its peers
// until the bench sends "stop" (every worker done): then it answers "final
// <workerFinal>", stops its nodes and exits.

// workerSpec is the nodes [Lo, Hi) of a run of N.
type workerSpec struct {
	Dir                        string
	Lo, Hi, N                  int
	Addrs                      []string
	Creds                      []creds // of nodes Lo to Hi
	CA, RegistryConf, EmptyDir string
	Pinned                     []string // repo@digest
	Images                     []imageRef
	MaxServing                 int
	ServeBPS, UpBPS, DownBPS   int64
	Fanout, PullWidth          int
	Stagger, Timeout           time.Duration
	Ports                      fdPorts
}

// nodeResult is one node's pull.
type nodeResult struct {
	Finish  time.Duration // from its join
	Retries int
	Done    bool
	Err     string // other than the run's time running out
}

// workerDone is a worker's nodes' pulls, its CPU time over them, its resident memory
// and its most open files.
type workerDone struct {
	Nodes  []nodeResult
	CPU    time.Duration
	RSSKiB int64
	FDs    fdCensus
}

// workerFinal is what its nodes uploaded to peers, once every node is done.
type workerFinal struct {
	ToPeers  []int64
	SetAside int64
	Dials    int64 // connections its nodes dialled to peers
	Purposes map[string]purposeCount
	Slow     int64 // requests to peers that timed out and were asked again (peers.Stats.Slow)
	AsideWhy map[string]int64
	// ConnEvents are what ended or broke its nodes' peer connections (peers.Stats).
	ConnEvents map[string]int64
	Samples    []string
	Climbed    []string
	Served     []servedEntry // what its nodes sent peers, by blob and asker
}

// runWorker is a worker process (-worker).
func runWorker() error {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("reading the spec: %w", err)
	}
	var w workerSpec
	if err := json.Unmarshal(line, &w); err != nil {
		return fmt.Errorf("the spec: %w", err)
	}
	pinned := map[string]bool{}
	for _, p := range w.Pinned {
		pinned[p] = true
	}
	warn := &warnCounter{}
	o := nodeOptions{addrs: w.Addrs, ca: w.CA, registryConf: w.RegistryConf, emptyDir: w.EmptyDir, pinned: pinned, maxServing: w.MaxServing,
		serveBPS: w.ServeBPS, upBPS: w.UpBPS, downBPS: w.DownBPS, fanout: w.Fanout, warnings: warn}
	count := w.Hi - w.Lo
	nodes := make([]*node, count)
	joined := make([]bool, count)
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer func() {
		stopServing()
		for i, nd := range nodes {
			if nd != nil {
				nd.stop(joined[i])
			}
		}
	}()
	for i := range count {
		if nodes[i], err = newNode(w.Dir, w.Lo+i, w.Creds[i], o); err != nil {
			return err
		}
	}
	if w.Stagger == 0 {
		for i, nd := range nodes {
			joined[i] = true
			if err := nd.join(serveCtx); err != nil {
				return err
			}
		}
	}
	fmt.Println("ready")

	line, err = in.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("waiting for go: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(string(line)), "go "), 10, 64)
	if err != nil {
		return fmt.Errorf("go: %q", line)
	}
	start := time.Unix(0, ns)
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(w.Timeout))
	defer cancel()
	fds := watchFDs(w.Ports, 3*time.Second)
	time.Sleep(time.Until(start))
	if *cpuProfile != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", *cpuProfile, w.Lo))
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
	}
	cpu0 := cpuTime()
	res := make([]nodeResult, count)
	var wg sync.WaitGroup
	for i, nd := range nodes {
		at := w.Stagger * time.Duration(w.Lo+i) / time.Duration(w.N)
		wg.Add(1)
		go func() {
			defer wg.Done()
			joinedAt := start
			var err error
			if w.Stagger > 0 {
				select {
				case <-time.After(time.Until(start.Add(at))):
				case <-ctx.Done():
					return
				}
				joinedAt = time.Now()
				joined[i] = true
				err = nd.join(serveCtx)
			}
			if err == nil {
				res[i].Retries, err = nd.pull(ctx, w.Images, w.PullWidth)
			}
			res[i].Finish = time.Since(joinedAt)
			res[i].Done = err == nil
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				res[i].Err = err.Error()
			}
		}()
	}
	wg.Wait()
	if *cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	done := workerDone{Nodes: res, CPU: cpuTime() - cpu0, RSSKiB: rssKiB(), FDs: fds.end()}
	if err := sendLine(os.Stdout, "done", done); err != nil {
		return err
	}

	if _, err := in.ReadBytes('\n'); err != nil && err != io.EOF {
		return fmt.Errorf("waiting for stop: %w", err)
	}
	final := workerFinal{SetAside: warn.setAside.Load(), Dials: warn.dials.Load(), Purposes: warn.purposes.snapshot()}
	for i, nd := range nodes {
		final.Served = append(final.Served, nd.served.entries(w.Lo+i)...)
		final.ToPeers = append(final.ToPeers, nd.stats.ToPeers.Load())
		final.Slow += nd.stats.Slow.Load()
		for k, v := range nd.stats.ConnEvents() {
			if final.ConnEvents == nil {
				final.ConnEvents = map[string]int64{}
			}
			final.ConnEvents[k] += v
		}
	}
	warn.mu.Lock()
	final.Samples = warn.samples
	final.AsideWhy = warn.asideWhy
	final.Climbed = warn.climbed
	warn.mu.Unlock()
	return sendLine(os.Stdout, "final", final)
}

func sendLine(w io.Writer, kind string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s %s\n", kind, data)
	return err
}

// worker is the bench's end of a worker process.
type worker struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string // its stdout, a line each (closed at its end)
}

func startWorker(spec workerSpec) (*worker, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"-worker"}
	if *cpuProfile != "" {
		args = append(args, "-cpuprofile", *cpuProfile)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, in: in, lines: make(chan string, 4)}
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	if err := sendLine(in, "", spec); err != nil {
		w.kill()
		return nil, err
	}
	return w, nil
}

// expect is the worker's next line of kind (JSON into v when not nil).
func (w *worker) expect(kind string, v any) error {
	for line := range w.lines {
		rest, ok := strings.CutPrefix(line, kind)
		if !ok {
			continue // not ours (a library printing)
		}
		if v == nil {
			return nil
		}
		return json.Unmarshal([]byte(strings.TrimSpace(rest)), v)
	}
	return fmt.Errorf("worker %d ended before %q: %v", w.cmd.Process.Pid, kind, w.cmd.Wait())
}

func (w *worker) send(line string) error {
	_, err := io.WriteString(w.in, line+"\n")
	return err
}

// kill ends the worker (it was started here) and waits for it.
func (w *worker) kill() {
	w.cmd.Process.Kill()
	w.cmd.Wait()
}

// wait closes its stdin and waits for it to exit.
func (w *worker) wait() error {
	w.in.Close()
	return w.cmd.Wait()
}
