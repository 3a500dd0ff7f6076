// Command aggbench is `make bench-aggregator`: 5,000 simulated nodes, each with its own
// kubelet-style client certificate and TLS connection, report 10 sets × 200 images to
// one imagepin-aggregator process on this machine, as fast as they can, while a reader
// asks for one set's rollup. It prints reports per second sustained, the read latency
// (p50, p99) under that load, and the aggregator's RSS.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
)

var (
	nodes    = flag.Int("nodes", 5000, "simulated nodes")
	sets     = flag.Int("sets", 10, "sets per node")
	images   = flag.Int("images", 200, "images per set")
	workers  = flag.Int("workers", 64, "concurrent senders")
	duration = flag.Duration("duration", 20*time.Second, "how long to load")
	binDir   = flag.String("bin", "bin", "directory with imagepin-aggregator")
	readAll  = flag.Bool("read-all", false, "read /v1/sets/{name}?nodes=all (every node listed) instead of the default")
	readURL  = flag.String("reader", "", "internal: be the reader process, reading this URL for -duration and printing each latency in µs")
	readerCA = flag.String("reader-ca", "", "internal: the CA the reader trusts (the read side is HTTPS)")
	rateFlag = flag.Int("rate", 0, "reports per second across all senders (0: as fast as they can)")
)

func main() {
	flag.Parse()
	if *readURL != "" {
		reader(*readURL, *readerCA, *duration)
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "aggbench:", err)
		os.Exit(1)
	}
}

func run() error {
	// Thousands of connections on each side: raise the open-file limit to its hard
	// limit (inherited by the aggregator).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raise RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur < uint64(*nodes)+1000 {
		return fmt.Errorf("open-file limit %d is too low for %d nodes", lim.Cur, *nodes)
	}
	dir, err := os.MkdirTemp("", "aggbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kubeletCA, _ := testcerts.NewCA(dir, "kubelet-ca")
	serverCA, _ := testcerts.NewCA(dir, "server-ca")
	cert, key, err := serverCA.Server(dir, "aggregator")
	if err != nil {
		return err
	}
	start := time.Now()
	certs := make([]tls.Certificate, *nodes)
	os.MkdirAll(filepath.Join(dir, "nodes"), 0o755)
	for i := range certs {
		p, err := kubeletCA.Node(filepath.Join(dir, "nodes"), nodeName(i))
		if err != nil {
			return err
		}
		if certs[i], err = tls.LoadX509KeyPair(p, p); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "%d node certificates in %s\n", *nodes, time.Since(start).Round(time.Millisecond))

	gp, _ := env.FreePort()
	hp, _ := env.FreePort()
	grpcAddr, httpURL := "127.0.0.1:"+strconv.Itoa(gp), "https://127.0.0.1:"+strconv.Itoa(hp)
	readClient, err := serverCA.HTTPClient("")
	if err != nil {
		return err
	}
	agg := exec.Command(filepath.Join(*binDir, "imagepin-aggregator"), "--grpc-address", grpcAddr, "--http-address", "127.0.0.1:"+strconv.Itoa(hp),
		"--tls-cert", cert, "--tls-key", key, "--client-ca", kubeletCA.File, "--max-nodes", strconv.Itoa(*nodes*2), "--log-level", "warn")
	agg.Stderr = os.Stderr
	if err := agg.Start(); err != nil {
		return err
	}
	defer func() { agg.Process.Signal(os.Interrupt); agg.Wait() }()
	for i := 0; ; i++ {
		if resp, err := readClient.Get(httpURL + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if i > 200 {
			return fmt.Errorf("aggregator did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}

	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(serverCA.File)
	pool.AppendCertsFromPEM(caPEM)
	clients := make([]v1.ReportsClient, *nodes)
	conns := make([]*grpc.ClientConn, *nodes)
	start = time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	var connErr atomic.Value
	for i := range clients {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{certs[i]}, RootCAs: pool})))
			if err != nil {
				connErr.Store(err)
				return
			}
			conns[i], clients[i] = c, v1.NewReportsClient(c)
			// The first report opens the connection (TLS handshake).
			if _, err := clients[i].Report(context.Background(), report(i, 1, 0)); err != nil {
				connErr.Store(err)
			}
		}(i)
	}
	wg.Wait()
	if err, ok := connErr.Load().(error); ok && err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	connectTime := time.Since(start)
	fmt.Fprintf(os.Stderr, "%d nodes connected and reported once in %s\n", *nodes, connectTime.Round(time.Millisecond))
	rssIdle := env.RSSKiB(agg.Process.Pid)

	// Load: every worker cycles through its share of nodes, back to back. Calls have
	// their own timeout, so the end of the run does not cut calls in flight.
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	call := func(c v1.ReportsClient, r *v1.NodeReport) error {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		_, err := c.Report(cctx, r)
		return err
	}
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	limit := rate.NewLimiter(rate.Inf, 1)
	if *rateFlag > 0 {
		limit = rate.NewLimiter(rate.Limit(*rateFlag), *workers)
	}
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			seq := uint64(2)
			for round := 0; ctx.Err() == nil; round++ {
				for i := w; i < *nodes && ctx.Err() == nil; i += *workers {
					if limit.Wait(ctx) != nil {
						break
					}
					err := call(clients[i], report(i, seq, round))
					if err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					sent.Add(1)
				}
				seq++
			}
		}(w)
	}
	// The reader: one set's rollup, 50 times a second, from a process of its own: in this
	// one it would wait behind the 64 senders in Go's scheduler (10 ms time slices),
	// and that is the load generator's latency, not the aggregator's.
	var lat []time.Duration
	readURL := httpURL + "/v1/sets/set-3"
	if *readAll {
		readURL += "?nodes=all"
	}
	self, _ := os.Executable()
	rd := exec.Command(self, "-reader", readURL, "-reader-ca", serverCA.File, "-duration", duration.String())
	var rdOut strings.Builder
	rd.Stdout, rd.Stderr = &rdOut, os.Stderr
	if err := rd.Start(); err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rd.Wait()
		for _, f := range strings.Fields(rdOut.String()) {
			if us, err := strconv.Atoi(f); err == nil {
				lat = append(lat, time.Duration(us)*time.Microsecond)
			}
		}
	}()
	loadStart := time.Now()
	peak := int64(0)
	for ctx.Err() == nil {
		time.Sleep(500 * time.Millisecond)
		if r := env.RSSKiB(agg.Process.Pid); r > peak {
			peak = r
		}
	}
	wg.Wait()
	elapsed := time.Since(loadStart)
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(os.Stderr, "first failed report: %v\n", e)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p int) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[(len(lat)-1)*p/100]
	}
	read := "GET /v1/sets/{name} (nodes not Ready listed)"
	if *readAll {
		read = "GET /v1/sets/{name}?nodes=all (all 5000 listed)"
	}
	load := "as fast as they can"
	if *rateFlag > 0 {
		load = fmt.Sprintf("%d reports/s in all", *rateFlag)
	}
	fmt.Printf("## Aggregator at scale: %d nodes (own client certificates) × %d sets × %d images, %d senders (%s), %s, 2 CPUs shared with the load\n\nReads: %s, 50 a second from a process of their own.\n\n",
		*nodes, *sets, *images, *workers, load, duration.String(), read)
	fmt.Printf("| reports/s sustained | failed | read p50 | read p99 | reads | RSS after connect | peak RSS under load | connect + first report |\n|---|---|---|---|---|---|---|---|\n")
	fmt.Printf("| %.0f | %d | %.1f ms | %.1f ms | %d | %.0f MiB | %.0f MiB | %s |\n\n", float64(sent.Load())/elapsed.Seconds(), failed.Load(),
		float64(pct(50).Microseconds())/1000, float64(pct(99).Microseconds())/1000, len(lat), float64(rssIdle)/1024, float64(peak)/1024, connectTime.Round(time.Millisecond))
	return nil
}

func nodeName(i int) string { return fmt.Sprintf("worker-%05d", i) }

// reader reads url 50 times a second for d (a busy dashboard, many times over),
// printing each answered read's latency in µs.
func reader(url, caFile string, d time.Duration) {
	pemCA, err := os.ReadFile(caFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemCA)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		<-tick.C
		t0 := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			fmt.Println(time.Since(t0).Microseconds())
		}
	}
}

// report is node i's status: sets × images, a few progressing.
func report(i int, seq uint64, round int) *v1.NodeReport {
	n := status.Node{Node: status.NodeInfo{Name: nodeName(i), Architecture: "amd64", Runtime: status.Runtime{Name: "cri-o", Version: "1.34.0"}}}
	for s := 0; s < *sets; s++ {
		ready := *images
		phase := status.Ready
		if (i+s+round)%17 == 0 {
			ready, phase = *images/2, status.Pulling
		}
		n.Sets = append(n.Sets, status.Set{Name: fmt.Sprintf("set-%d", s), UID: fmt.Sprintf("uid-%d", s), SpecHash: "abcdef0123456789",
			File: fmt.Sprintf("set-%d.yaml", s), Phase: phase, ImagesTotal: *images, ImagesReady: ready,
			BytesTotal: uint64(*images) * 50 << 20, BytesReady: uint64(ready) * 50 << 20,
			Conditions: []status.Condition{{Type: status.ConditionReady, Status: "True", Reason: status.ReasonAllImagesPinned, Message: strings.Repeat("m", 40)}}})
	}
	return v1.FromStatus(n, "boot-1", seq, 30*time.Second)
}
