// Command bench is `make bench`: it measures, through real CRI-O, pre-loading one set
// of distinct images (shared base layers) with imagepind side by side with a sequential
// `crictl pull` loop and N parallel CRI pulls, on loopback and behind an emulated slow
// registry link (toxiproxy); then the latency from a set file change to the pin being
// in effect; then imagepind's idle RSS and CPU with 3 sets Ready, [peers] off and on.
// Every run gets a fresh CRI-O (empty storage). It prints markdown tables with medians
// and ratios, and ends with the Goals table (goals.go): every goal it measures, even
// when a section stopped on an error.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/goals"
)

var (
	reps     = flag.Int("reps", 3, "repetitions of each measurement")
	nImages  = flag.Int("images", 40, "images in the set")
	widths   = flag.String("widths", "1,2,4,8,16,32,64", "parallel CRI pull widths (behind slow links from 8)")
	idleFor  = flag.Duration("idle", time.Minute, "how long to watch the idle daemon")
	changes  = flag.Int("changes", 30, "set file changes for the pin latency")
	linkList = flag.String("links", "loopback,slow,satellite", "registry links for the pre-load: loopback, slow (+25 ms, 4000 KB/s a connection), satellite (+100 ms, 1000 KB/s a connection)")
	runtimes = flag.String("runtimes", "cri-o,containerd", "runtimes for the pre-load")
	binDir   = flag.String("bin", "bin", "directory with imagepind")
	sections = flag.String("sections", "preload,large,latency,disk,release,peers,seed,cluster-rollout", "what to measure: preload, large (2000-image set), latency (also idle, [peers] off and on), disk, release, peers (several nodes behind one shared link), seed (imagepinctl seed against cp), cluster-rollout (a whole cluster: rollout and node join with the registry gone)")
	costN    = flag.Int("cost-images", 500, "images for the disk check cost")
	keep     = flag.Bool("keep", false, "keep the working directory (logs) for a look afterwards")
	gcHigh   = flag.Int("gc-high-threshold", 0, "imagepind's [disk] gc_high_threshold_percent (0: its default, the kubelet's 85%); 100 leaves this machine's disk room for the P1 set's most (no Range request in the disk check)")
)

func want(section string) bool { return strings.Contains(","+*sections+",", ","+section+",") }

func main() {
	flag.Parse()
	g := benchGoals()
	err := run(context.Background(), g)
	g.Print(os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	dir  string
	reg  *env.Registry
	imgs []env.Image
	// links are the registry's addresses: loopback, and each slow link's proxy.
	links []link
	// timelines are imagepind's phases per runtime/link (recordTimeline).
	timelines map[string]string
	phaseRuns map[string]map[string][]time.Duration
	// goals are the goals' figures, as the sections measure them.
	goals *goals.Table
	// daemonCPU is the CPU the last imagepind run used, from the set's write to Ready.
	daemonCPU time.Duration
}

// link is a way to the registry: loopback, or a toxiproxy in front of it with latency
// each way and bandwidth per connection.
type link struct {
	name      string
	latencyMs int
	rateKBps  int
	host      string // host:port to pull from
}

func (l link) title() string {
	if l.latencyMs == 0 {
		return "registry on loopback"
	}
	return fmt.Sprintf("registry behind a %s link (toxiproxy: +%d ms latency each way, %d KB/s per connection)", l.name, l.latencyMs, l.rateKBps)
}

var knownLinks = map[string]link{
	"loopback":  {name: "loopback"},
	"slow":      {name: "slow", latencyMs: 25, rateKBps: 4000},
	"satellite": {name: "satellite", latencyMs: 100, rateKBps: 1000},
}

func run(ctx context.Context, g *goals.Table) error {
	dir, err := os.MkdirTemp("", "imagepin-bench-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(os.Stderr, "keeping %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b := &bench{dir: dir, goals: g}
	os.MkdirAll(filepath.Join(dir, "registry"), 0o755)
	if b.reg, err = env.StartRegistry(filepath.Join(dir, "registry")); err != nil {
		return err
	}
	defer b.reg.Stop()
	var bases []v1.Layer
	for i := 0; i < 3; i++ {
		l, err := env.RandomLayer(1 << 20)
		if err != nil {
			return err
		}
		bases = append(bases, l)
	}
	var layers, bytes int64
	for i := 0; i < *nImages; i++ {
		img, err := b.reg.PushRandom(ctx, fmt.Sprintf("bench/app-%02d", i), 2, 512<<10, bases[i%len(bases)])
		if err != nil {
			return err
		}
		b.imgs = append(b.imgs, img)
		layers += 3
		bytes += img.Size
	}
	fmt.Printf("# imagepin benchmarks (%s)\n\n", time.Now().UTC().Format(time.RFC3339))
	unique := int64(len(bases))<<20 + int64(*nImages)*(1<<20)
	fmt.Printf("Set: %d distinct images, %d layer references (3 shared 1 MiB base layers, 2 unique 512 KiB layers each): %.1f MiB compressed summed over images, %.1f MiB unique.\n",
		*nImages, layers, float64(bytes)/(1<<20), float64(unique)/(1<<20))
	version := func(binary string) string {
		v, err := env.RuntimeVersion(binary)
		if err != nil {
			return "(version unknown: " + err.Error() + ")"
		}
		return v
	}
	fmt.Printf("Machine: %d CPUs. Each run: a fresh CRI-O %s or containerd %s with empty storage. %d repetitions; medians.\n\n", numCPU(), version("crio"), version("containerd"), *reps)

	if want("release") {
		if err := b.releaseCost(ctx, 190); err != nil {
			return err
		}
	}
	if want("seed") {
		if err := b.seedBench(ctx); err != nil {
			return err
		}
	}
	if want("cluster-rollout") {
		if err := b.clusterRollout(ctx); err != nil {
			return err
		}
	}
	if want("peers") {
		// Its own links (one shared token bucket each), no toxiproxy.
		if err := b.peers(ctx); err != nil {
			return err
		}
	}
	if !want("disk") && !want("preload") && !want("large") && !want("latency") {
		return nil
	}
	stopProxy, err := b.startLinks()
	if err != nil {
		return err
	}
	defer stopProxy()
	if want("disk") {
		if err := b.diskCost(ctx, *costN); err != nil {
			return err
		}
		if err := b.diskAccuracy(ctx); err != nil {
			return err
		}
	}
	if want("preload") {
		for _, l := range b.links {
			for _, rt := range strings.Split(*runtimes, ",") {
				if err := b.preload(ctx, l, rt); err != nil {
					return err
				}
			}
		}
	}
	if want("large") {
		if err := b.large(ctx); err != nil {
			return err
		}
	}

	if !want("latency") {
		return nil
	}
	if err := b.daemonLatency(ctx); err != nil {
		return err
	}
	return b.idleSideBySide(ctx)
}

func numCPU() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// refs are the set's references through a link.
func (b *bench) refs(l link) []string {
	var out []string
	for _, img := range b.imgs {
		out = append(out, strings.Replace(img.Ref(), b.reg.Host, l.host, 1))
	}
	return out
}

// insecure are the registry's addresses, every link's.
func (b *bench) insecure() []string {
	hosts := []string{b.reg.Host}
	for _, l := range b.links {
		if l.host != b.reg.Host {
			hosts = append(hosts, l.host)
		}
	}
	return hosts
}

// freshCRIO starts a CRI-O with empty storage that reaches the registry every way.
func (b *bench) freshCRIO(ctx context.Context, name string) (*env.CRIO, error) {
	c, err := env.NewCRIO(filepath.Join(b.dir, name), env.CRIOOptions{Insecure: b.insecure()})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// node is a fresh runtime with empty storage: CRI-O or containerd.
type node struct {
	runtime string
	socket  string
	crio    *env.CRIO
	ctr     *env.Containerd
	// exe is imagepind's executable on this node ("": -bin's).
	exe string
}

func (b *bench) freshNode(ctx context.Context, runtime, name string) (*node, error) {
	n := &node{runtime: runtime}
	switch runtime {
	case "cri-o":
		c, err := b.freshCRIO(ctx, name)
		if err != nil {
			return nil, err
		}
		n.crio, n.socket = c, c.Socket
	case "containerd":
		c, err := env.NewContainerd(filepath.Join(b.dir, name), env.ContainerdOptions{Insecure: b.insecure()})
		if err != nil {
			return nil, err
		}
		if err := c.Start(ctx); err != nil {
			c.Cleanup()
			return nil, err
		}
		n.ctr, n.socket = c, c.Socket
	default:
		return nil, fmt.Errorf("runtime %q: cri-o or containerd", runtime)
	}
	return n, nil
}

// pid is the runtime's process.
func (n *node) pid() int {
	if n.crio != nil {
		return n.crio.PID()
	}
	return n.ctr.PID()
}

// stop stops the runtime and unmounts its storage, leaving its files (logs) in place.
func (n *node) stop() {
	if n.crio != nil {
		n.crio.Stop()
	}
	if n.ctr != nil {
		n.ctr.Stop()
	}
}

func (n *node) cleanup() {
	if n.crio != nil {
		n.crio.Cleanup()
		os.RemoveAll(n.crio.Dir)
	}
	if n.ctr != nil {
		n.ctr.Cleanup()
		os.RemoveAll(n.ctr.Dir)
	}
}

// imagepindConfig is the runtime part of an imagepind config for this node.
func (n *node) imagepindConfig() string {
	if n.crio != nil {
		disk := n.crio.DiskConfig()
		if *gcHigh > 0 {
			disk += fmt.Sprintf("gc_high_threshold_percent = %d\n", *gcHigh)
		}
		return fmt.Sprintf("[cri]\nendpoint = \"unix://%s\"\n", n.socket) +
			fmt.Sprintf("[crio]\nconfig = %q\nconfig_dir = %q\nreload = \"signal\"\n", n.crio.Config, n.crio.ConfigDir) + disk
	}
	return fmt.Sprintf("[cri]\nendpoint = \"unix://%s\"\n[containerd]\nconfig_path = %q\n", n.socket, n.ctr.HostsDir)
}

type method struct {
	name string
	run  func(ctx context.Context, n *node, refs []string) (time.Duration, error)
}

func (b *bench) preload(ctx context.Context, l link, runtime string) error {
	methods := []method{{"`crictl pull` loop, sequential", crictlLoop}}
	if l.latencyMs > 0 {
		methods = nil // minutes on a slow link, and never the best: the widths say enough
	}
	var widthNames []string
	for _, w := range strings.Split(*widths, ",") {
		n, _ := strconv.Atoi(w)
		if l.latencyMs > 0 && n < 8 {
			continue // never the best behind a slow link, and minutes each
		}
		widthNames = append(widthNames, fmt.Sprintf("CRI PullImage, %d in parallel", n))
		methods = append(methods, method{widthNames[len(widthNames)-1], func(ctx context.Context, nd *node, refs []string) (time.Duration, error) {
			return criParallel(ctx, nd.socket, refs, n)
		}})
	}
	imagepindAt := len(methods)
	methods = append(methods,
		method{"imagepind, pull_concurrency default (found as it goes, at most " + strconv.Itoa(conf.DefaultPullConcurrency) + ")", func(ctx context.Context, nd *node, refs []string) (time.Duration, error) {
			return b.imagepind(ctx, nd, refs, 0)
		}},
		// The same, pulling nothing before the disk check's verdict: what pulls while the
		// check runs save, side by side.
		method{"imagepind, `pull_while_checking = false`", func(ctx context.Context, nd *node, refs []string) (time.Duration, error) {
			return b.imagepind(ctx, nd, refs, 0, "[disk]\npull_while_checking = false\n")
		}})
	refs := b.refs(l)
	results := make([][]time.Duration, len(methods))
	cpu := make([][]cpuUse, len(methods))
	for rep := 0; rep < *reps; rep++ {
		// Interleave the methods in each repetition so drift hits them all alike.
		for i, m := range methods {
			nd, err := b.freshNode(ctx, runtime, fmt.Sprintf("%s-%s-%d-%d", runtime, l.name, rep, i))
			if err != nil {
				return err
			}
			b.daemonCPU = 0
			mark := markCPU(b.reg.PID(), nd.pid())
			d, err := m.run(ctx, nd, refs)
			cpu[i] = append(cpu[i], mark.since(b.daemonCPU))
			if *keep {
				nd.stop()
			} else {
				nd.cleanup()
			}
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			results[i] = append(results[i], d)
			fmt.Fprintf(os.Stderr, "  %s / %s / %s: %s\n", runtime, l.name, m.name, d.Round(time.Millisecond))
		}
	}
	best, bestName := time.Duration(0), ""
	for i := 0; i < imagepindAt; i++ {
		if med := median(results[i]); strings.HasPrefix(methods[i].name, "CRI PullImage") && (best == 0 || med < best) {
			best, bestName = med, methods[i].name
		}
	}
	fmt.Printf("## P1: pre-load %d images on %s, %s\n\n| method | median | runs | vs the best raw CRI width (%s) | CPU s: registry / runtime / imagepind | machine busy |\n|---|---|---|---|---|---|\n", len(refs), runtime, l.title(), strings.TrimPrefix(bestName, "CRI PullImage, "))
	for i, m := range methods {
		med := median(results[i])
		fmt.Printf("| %s | %.2f s | %s | %.3f× | %s |\n", m.name, med.Seconds(), runs(results[i]), float64(med)/float64(best), cpuColumn(cpu[i]))
	}
	fmt.Println()
	if *gcHigh > 0 {
		fmt.Printf("imagepind ran with gc_high_threshold_percent = %d (-gc-high-threshold), not the default the goal is measured with.\n\n", *gcHigh)
	} else if ipd := median(results[imagepindAt]); best > 0 {
		b.goals.Measured(goalP1(runtime, l), goals.Measurement{Value: float64(ipd) / float64(best), Detail: fmt.Sprintf("imagepind %.2f s", ipd.Seconds()),
			Baseline: fmt.Sprintf("the best raw CRI width (%s): %.2f s", strings.TrimPrefix(bestName, "CRI PullImage, "), best.Seconds())})
	}
	fmt.Printf("imagepind's timeline (default concurrency; medians of its runs, from the set file's rename): %s\n\n", b.timelines[timelineKey(runtime, l.host)])
	return nil
}

func crictlLoop(ctx context.Context, n *node, refs []string) (time.Duration, error) {
	crictl := filepath.Join(env.CacheDir(), "crictl")
	start := time.Now()
	for _, r := range refs {
		out, err := exec.CommandContext(ctx, crictl, "--runtime-endpoint", "unix://"+n.socket, "--timeout", "10m", "pull", r).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("crictl pull %s: %v: %s", r, err, out)
		}
	}
	return time.Since(start), nil
}

func criParallel(ctx context.Context, socket string, refs []string, width int) (time.Duration, error) {
	client, err := cri.Dial("unix://" + socket)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	start := time.Now()
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for _, r := range refs {
		wg.Add(1)
		sem <- struct{}{}
		go func(r string) {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := client.PullImage(ctx, r, nil); err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
			}
		}(r)
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// daemon is a running imagepind.
type daemon struct {
	cmd    *exec.Cmd
	sets   string
	status string
	log    string
}

func (b *bench) startDaemon(n *node, name string, concurrency int, unpinDelay string, extra ...string) (*daemon, error) {
	dir := filepath.Join(b.dir, name)
	d := &daemon{sets: filepath.Join(dir, "sets.d"), status: filepath.Join(dir, "status.json"), log: filepath.Join(dir, "imagepind.log")}
	os.MkdirAll(d.sets, 0o755)
	cfg := fmt.Sprintf("sets_dir = %q\nstate_dir = %q\nstatus_file = %q\nunpin_delay = %q\n[node]\nlabels_file = %q\n",
		d.sets, filepath.Join(dir, "state"), d.status, unpinDelay, filepath.Join(dir, "labels.json")) + n.imagepindConfig()
	cfg = strings.Replace(cfg, "[cri]\n", fmt.Sprintf("[cri]\npull_concurrency = %d\n", concurrency), 1)
	for _, e := range extra {
		// A [disk] table once: an extra one's keys go into the node's.
		if keys, ok := strings.CutPrefix(e, "[disk]\n"); ok && strings.Contains(cfg, "[disk]\n") {
			cfg = strings.Replace(cfg, "[disk]\n", "[disk]\n"+keys, 1)
			continue
		}
		cfg += e
	}
	cfgPath := filepath.Join(dir, "imagepind.toml")
	os.WriteFile(cfgPath, []byte(cfg), 0o644)
	logf, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	exe := filepath.Join(*binDir, "imagepind")
	if n.exe != "" {
		exe = n.exe
	}
	d.cmd = exec.Command(exe, "--config", cfgPath)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	// Wait for its first status: started and reconciled.
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(d.status); err == nil {
			return d, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.stop()
	return nil, fmt.Errorf("imagepind wrote no status; see %s", d.log)
}

func (d *daemon) stop() {
	d.cmd.Process.Signal(os.Interrupt)
	d.cmd.Wait()
}

func (d *daemon) writeSet(name string, refs []string) {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: %s}\nspec:\n  pinnedImages:\n", name)
	for _, r := range refs {
		fmt.Fprintf(&b, "  - %s\n", r)
	}
	tmp := filepath.Join(d.sets, "."+name+".tmp")
	os.WriteFile(tmp, []byte(b.String()), 0o644)
	os.Rename(tmp, filepath.Join(d.sets, name+".yaml"))
}

func (d *daemon) waitReady(names ...string) error {
	deadline := time.Now().Add(30 * time.Minute)
	for time.Now().Before(deadline) {
		n, _ := status.ReadFile(d.status)
		ready := true
		for _, name := range names {
			s := n.Set(name)
			ready = ready && s != nil && s.Phase == status.Ready
		}
		if ready {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("sets %v not Ready; see %s", names, d.log)
}

func (b *bench) imagepind(ctx context.Context, n *node, refs []string, concurrency int, extra ...string) (time.Duration, error) {
	d, err := b.startDaemon(n, fmt.Sprintf("d-%d", time.Now().UnixNano()), concurrency, "2m", extra...)
	if err != nil {
		return 0, err
	}
	defer d.stop()
	t0, _ := cpuTicks(d.cmd.Process.Pid)
	start := time.Now()
	d.writeSet("bench", refs)
	if err := d.waitReady("bench"); err != nil {
		return 0, err
	}
	took := time.Since(start)
	if t1, err := cpuTicks(d.cmd.Process.Pid); err == nil {
		b.daemonCPU = ticks(t1 - t0)
	}
	if concurrency == 0 && len(extra) == 0 {
		b.recordTimeline(n, refs, start, d.log)
	}
	return took, nil
}

func (b *bench) daemonLatency(ctx context.Context) error {
	n, err := b.freshNode(ctx, "cri-o", "crio-latency")
	if err != nil {
		return err
	}
	defer n.cleanup()
	c := n.crio
	client, err := cri.Dial("unix://" + c.Socket)
	if err != nil {
		return err
	}
	defer client.Close()
	refs := b.refs(b.links[0])
	// Present but unpinned images to pin one at a time.
	for _, r := range refs[:min(*changes, len(refs))] {
		if _, err := client.PullImage(ctx, r, nil); err != nil {
			return err
		}
	}
	d, err := b.startDaemon(n, "latency", 0, "0s")
	if err != nil {
		return err
	}
	defer d.stop()
	var lat []time.Duration
	for i := 0; i < *changes; i++ {
		ref := refs[i%len(refs)]
		start := time.Now()
		d.writeSet("probe", []string{ref})
		for {
			img, err := client.ImageStatus(ctx, ref)
			if err == nil && img.Pinned {
				break
			}
			if time.Since(start) > time.Minute {
				return fmt.Errorf("%s never pinned; see %s", ref, d.log)
			}
			time.Sleep(2 * time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	os.Remove(filepath.Join(d.sets, "probe.yaml"))
	fmt.Printf("## Set file change → pin in effect (CRI ImageStatus pinned=true), %d changes, loopback\n\n", len(lat))
	fmt.Printf("Measured from the rename of the set file into the watched directory (a lone change waits a 25 ms settle, not the 250 ms debounce).\n\n")
	fmt.Printf("| p50 | p95 | min | max |\n|---|---|---|---|\n| %d ms | %d ms | %d ms | %d ms |\n\n",
		pct(lat, 50).Milliseconds(), pct(lat, 95).Milliseconds(), pct(lat, 0).Milliseconds(), pct(lat, 100).Milliseconds())
	fmt.Printf("imagepind's own reload→confirm times (its log, `pins confirmed ... took`): %s\n\n", confirmTimes(d.log))

	return nil
}

func confirmTimes(logPath string) string {
	b, _ := os.ReadFile(logPath)
	var ds []time.Duration
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, "pins confirmed in effect") {
			continue
		}
		if i := strings.Index(line, "took="); i >= 0 {
			if d, err := time.ParseDuration(strings.Fields(line[i+5:])[0]); err == nil && d > 0 {
				ds = append(ds, d)
			}
		}
	}
	if len(ds) == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %d ms, p95 %d ms over %d reloads", pct(ds, 50).Milliseconds(), pct(ds, 95).Milliseconds(), len(ds))
}

func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b)[bytes.LastIndexByte(b, ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s, nil
}

func lineCount(p string) int {
	b, _ := os.ReadFile(p)
	return bytes.Count(b, []byte("\n"))
}

func median(ds []time.Duration) time.Duration { return pct(ds, 50) }

func pct(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	i := (len(s) - 1) * p / 100
	return s[i]
}

func runs(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("%.2f", d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

// startLinks makes the links asked for: loopback is the registry itself; each slow one a
// toxiproxy proxy in front of it.
func (b *bench) startLinks() (func(), error) {
	b.links = nil
	var slow []link
	for _, name := range strings.Split(*linkList, ",") {
		l, ok := knownLinks[name]
		if !ok {
			return nil, fmt.Errorf("-links: unknown link %q", name)
		}
		if l.latencyMs == 0 {
			l.host = b.reg.Host
			b.links = append(b.links, l)
		} else {
			slow = append(slow, l)
		}
	}
	if len(b.links) == 0 {
		b.links = append(b.links, link{name: "loopback", host: b.reg.Host})
	}
	if len(slow) == 0 {
		return func() {}, nil
	}
	apiPort, _ := env.FreePort()
	cmd := exec.Command(filepath.Join(env.CacheDir(), "toxiproxy-server"), "-host", "127.0.0.1", "-port", strconv.Itoa(apiPort))
	logf, _ := os.Create(filepath.Join(b.dir, "toxiproxy.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("toxiproxy (run hack/bench-deps.sh): %w", err)
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait() }
	api := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	post := func(path string, body any) error {
		j, _ := json.Marshal(body)
		var err error
		for i := 0; i < 100; i++ {
			var resp *http.Response
			resp, err = http.Post(api+path, "application/json", bytes.NewReader(j))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode >= 300 {
					return fmt.Errorf("toxiproxy %s: %s", path, resp.Status)
				}
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
		return err
	}
	for _, l := range slow {
		port, _ := env.FreePort()
		l.host = fmt.Sprintf("127.0.0.1:%d", port)
		if err := post("/proxies", map[string]any{"name": l.name, "listen": l.host, "upstream": b.reg.Host, "enabled": true}); err != nil {
			stop()
			return nil, err
		}
		for _, stream := range []string{"downstream", "upstream"} {
			if err := post("/proxies/"+l.name+"/toxics", map[string]any{"name": "latency-" + stream, "type": "latency", "stream": stream, "attributes": map[string]int{"latency": l.latencyMs}}); err != nil {
				stop()
				return nil, err
			}
		}
		if err := post("/proxies/"+l.name+"/toxics", map[string]any{"name": "bandwidth", "type": "bandwidth", "stream": "downstream", "attributes": map[string]int{"rate": l.rateKBps}}); err != nil {
			stop()
			return nil, err
		}
		b.links = append(b.links, l)
	}
	return stop, nil
}
