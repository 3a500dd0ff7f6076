package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
)

// idleReading is what an idle imagepind held and spent over -idle: resident memory
// (medians of one reading a second, KiB), CPU time, CRI calls.
type idleReading struct {
	rss, anon, file int64
	heap            string // Go heap in use / released to the system, from the metrics endpoint
	cpuSec          float64
	crioLines       int
}

// idleSideBySide measures imagepind idle with the latency section's 3 sets Ready, on a
// fresh CRI-O each, with [peers] off and with [peers] on (the node-local mirror, the
// blob store and the peers' HTTPS server, sharing with mTLS): the same sets, pulled
// through imagepind, then -idle of nothing.
func (b *bench) idleSideBySide(ctx context.Context) error {
	refs := b.refs(b.links[0])
	third := len(refs) / 3
	sets := map[string][]string{"idle-a": refs[:third], "idle-b": refs[third : 2*third], "idle-c": refs[2*third:]}
	ca, err := testcerts.NewCA(b.dir, "idle-ca")
	if err != nil {
		return err
	}
	var rows []string
	for _, peersOn := range []bool{false, true} {
		r, err := b.idleOnce(ctx, sets, peersOn, ca)
		if err != nil {
			return err
		}
		mode := "off"
		if peersOn {
			mode = "on (mirror, blob store, peers' HTTPS server)"
		}
		rows = append(rows, fmt.Sprintf("| %s | %.1f MiB | %.1f / %.1f MiB | %s | %.2f s | %.3f%% | %d |", mode,
			float64(r.rss)/1024, float64(r.anon)/1024, float64(r.file)/1024, r.heap, r.cpuSec, 100*r.cpuSec/idleFor.Seconds(), r.crioLines))
	}
	fmt.Printf("## Idle RSS, [peers] on vs off: 3 sets Ready (%d images, pulled by imagepind on a fresh CRI-O), over %s\n\n", len(refs), idleFor.String())
	fmt.Printf("Resident memory: medians of one reading a second (/proc/PID/status), from 2 s after the sets were Ready. Go heap: in use / released to the system at the end (the metrics endpoint).\n\n")
	fmt.Println("| [peers] | RSS | of which anonymous / file | Go heap in use / released | CPU time | CPU share of one core | CRI-O log lines (each CRI call logs one) |")
	fmt.Println("|---|---|---|---|---|---|---|")
	fmt.Println(strings.Join(rows, "\n"))
	fmt.Println()
	return nil
}

func (b *bench) idleOnce(ctx context.Context, sets map[string][]string, peersOn bool, ca *testcerts.CA) (idleReading, error) {
	name := "idle-peers-off"
	if peersOn {
		name = "idle-peers-on"
	}
	n, err := b.freshNode(ctx, "cri-o", name+"-crio")
	if err != nil {
		return idleReading{}, err
	}
	defer n.cleanup()
	dir := filepath.Join(b.dir, name)
	os.MkdirAll(dir, 0o755)
	mport, err := env.FreePort()
	if err != nil {
		return idleReading{}, err
	}
	extra := []string{fmt.Sprintf("[metrics]\naddress = \"127.0.0.1:%d\"\n", mport)}
	if peersOn {
		pport, err := env.FreePort()
		if err != nil {
			return idleReading{}, err
		}
		mirror, err := env.FreePort()
		if err != nil {
			return idleReading{}, err
		}
		addr := fmt.Sprintf("127.0.0.2:%d", pport)
		serving, err := ca.NodeServing(dir, "node-0", net.ParseIP("127.0.0.2"))
		if err != nil {
			return idleReading{}, err
		}
		client, err := ca.Node(dir, "node-0")
		if err != nil {
			return idleReading{}, err
		}
		extra = append(extra, fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\naddress = %q\nnodes = [%q]\ncert = %q\nca = %q\nclient_cert = %q\nclient_ca = %q\n",
			mirror, addr, addr, serving, ca.File, client, ca.File))
	}
	d, err := b.startDaemon(n, filepath.Join(name, "d"), 0, "2m", extra...)
	if err != nil {
		return idleReading{}, err
	}
	defer d.stop()
	var names []string
	for s, refs := range sets {
		d.writeSet(s, refs)
		names = append(names, s)
	}
	if err := d.waitReady(names...); err != nil {
		return idleReading{}, err
	}
	ready := time.Now()
	pid := d.cmd.Process.Pid
	var early []string
	for time.Since(ready) < 2*time.Second {
		a, f := env.RSSParts(pid)
		early = append(early, fmt.Sprintf("%.1fs %d+%d", time.Since(ready).Seconds(), a, f))
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "  idle / %s: KiB anonymous+file after Ready: %s\n", name, strings.Join(early, ", "))
	cpu0, _ := cpuTicks(pid)
	lines0 := lineCount(n.crio.LogFile)
	var rss, anon, file []time.Duration
	for end := time.Now().Add(*idleFor); time.Now().Before(end); time.Sleep(time.Second) {
		a, f := env.RSSParts(pid)
		rss, anon, file = append(rss, time.Duration(env.RSSKiB(pid))), append(anon, time.Duration(a)), append(file, time.Duration(f))
	}
	cpu1, _ := cpuTicks(pid)
	var series []string
	for i := range anon {
		series = append(series, fmt.Sprintf("%d+%d", anon[i], file[i]))
	}
	fmt.Fprintf(os.Stderr, "  idle / %s: KiB anonymous+file a second from 2 s after Ready: %s\n", name, strings.Join(series, " "))
	r := idleReading{rss: int64(median(rss)), anon: int64(median(anon)), file: int64(median(file)),
		cpuSec: float64(cpu1-cpu0) / 100, crioLines: lineCount(n.crio.LogFile) - lines0}
	r.heap = goHeap(fmt.Sprintf("http://127.0.0.1:%d/metrics", mport))
	return r, nil
}

// goHeap is "in use / released" MiB of the Go heap, from a Prometheus endpoint's Go
// collector.
func goHeap(url string) string {
	body, err := httpGet(url)
	if err != nil {
		return "?"
	}
	val := func(metric string) float64 {
		for _, line := range strings.Split(body, "\n") {
			if rest, ok := strings.CutPrefix(line, metric+" "); ok {
				var v float64
				fmt.Sscan(rest, &v)
				return v
			}
		}
		return -1
	}
	return fmt.Sprintf("%.1f / %.1f MiB", val("go_memstats_heap_inuse_bytes")/(1<<20), val("go_memstats_heap_released_bytes")/(1<<20))
}

func httpGet(url string) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
