// Command bench is `make bench`: it measures, through real CRI-O, pre-loading one set
// of distinct images (shared base layers) with imagepind side by side with a sequential
// `crictl pull` loop and N parallel CRI pulls, on loopback and behind an emulated slow
// registry link (toxiproxy); then the latency from a set file change to the pin being
// in effect; then imagepind's idle RSS and CPU with 3 sets Ready. Every run gets a fresh
// CRI-O (empty storage). It prints markdown tables with medians and ratios.
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
)

var (
	reps     = flag.Int("reps", 3, "repetitions of each measurement")
	nImages  = flag.Int("images", 40, "images in the set")
	widths   = flag.String("widths", "1,2,4,8,16", "parallel CRI pull widths")
	idleFor  = flag.Duration("idle", time.Minute, "how long to watch the idle daemon")
	changes  = flag.Int("changes", 30, "set file changes for the pin latency")
	latency  = flag.Int("latency-ms", 25, "slow link: added latency per direction")
	rateKBps = flag.Int("rate-kbps", 4000, "slow link: bandwidth per connection, KB/s")
	binDir   = flag.String("bin", "bin", "directory with imagepind")
	sections = flag.String("sections", "preload,latency,disk,release", "what to measure: preload, latency (also idle), disk, release")
	costN    = flag.Int("cost-images", 500, "images for the disk check cost")
)

func want(section string) bool { return strings.Contains(","+*sections+",", ","+section+",") }

func main() {
	flag.Parse()
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	dir  string
	reg  *env.Registry
	imgs []env.Image
	// proxied is the slow link's host:port in front of the registry.
	proxied string
}

func run(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "imagepin-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	b := &bench{dir: dir}
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
	fmt.Printf("Machine: %d CPUs. Each run: a fresh CRI-O 1.34.0 with empty storage. %d repetitions; medians.\n\n", numCPU(), *reps)

	if want("disk") {
		if err := b.diskCost(ctx, *costN); err != nil {
			return err
		}
		if err := b.diskAccuracy(ctx); err != nil {
			return err
		}
	}
	if want("release") {
		if err := b.releaseCost(ctx, 190); err != nil {
			return err
		}
	}
	if !want("preload") && !want("latency") {
		return nil
	}
	stopProxy, err := b.startSlowLink()
	if err != nil {
		return err
	}
	defer stopProxy()

	for _, slow := range []bool{false, true} {
		if !want("preload") {
			break
		}
		title := "registry on loopback"
		if slow {
			title = fmt.Sprintf("registry behind a slow link (toxiproxy: +%d ms latency, %d KB/s per connection)", *latency, *rateKBps)
		}
		if err := b.preload(ctx, title, slow); err != nil {
			return err
		}
	}
	if !want("latency") {
		return nil
	}
	return b.daemonLatencyAndIdle(ctx)
}

func numCPU() int {
	out, _ := exec.Command("nproc").Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func (b *bench) refs(slow bool) []string {
	var out []string
	for _, img := range b.imgs {
		r := img.Ref()
		if slow {
			r = strings.Replace(r, b.reg.Host, b.proxied, 1)
		}
		out = append(out, r)
	}
	return out
}

// freshCRIO starts a CRI-O with empty storage that reaches the registry both ways.
func (b *bench) freshCRIO(ctx context.Context, name string) (*env.CRIO, error) {
	c, err := env.NewCRIO(filepath.Join(b.dir, name), env.CRIOOptions{Insecure: []string{b.reg.Host, b.proxied}})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

type method struct {
	name string
	run  func(ctx context.Context, c *env.CRIO, refs []string) (time.Duration, error)
}

func (b *bench) preload(ctx context.Context, title string, slow bool) error {
	methods := []method{{"`crictl pull` loop, sequential", crictlLoop}}
	for _, w := range strings.Split(*widths, ",") {
		n, _ := strconv.Atoi(w)
		methods = append(methods, method{fmt.Sprintf("CRI PullImage, %d in parallel", n), func(ctx context.Context, c *env.CRIO, refs []string) (time.Duration, error) {
			return criParallel(ctx, c, refs, n)
		}})
	}
	for _, k := range []int{4, 0} {
		label := fmt.Sprintf("imagepind, pull_concurrency default (%d)", conf.DefaultPullConcurrency)
		if k != 0 {
			label = fmt.Sprintf("imagepind, pull_concurrency %d", k)
		}
		methods = append(methods, method{label, func(ctx context.Context, c *env.CRIO, refs []string) (time.Duration, error) {
			return b.imagepind(ctx, c, refs, k)
		}})
	}
	refs := b.refs(slow)
	results := make([][]time.Duration, len(methods))
	for rep := 0; rep < *reps; rep++ {
		// Interleave the methods in each repetition so drift hits them all alike.
		for i, m := range methods {
			c, err := b.freshCRIO(ctx, fmt.Sprintf("crio-%v-%d-%d", slow, rep, i))
			if err != nil {
				return err
			}
			d, err := m.run(ctx, c, refs)
			c.Cleanup()
			os.RemoveAll(c.Dir)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			results[i] = append(results[i], d)
			fmt.Fprintf(os.Stderr, "  %s / %s: %s\n", title, m.name, d.Round(time.Millisecond))
		}
	}
	base := median(results[0])
	fmt.Printf("## Pre-load %d images, %s\n\n| method | median | runs | vs sequential crictl |\n|---|---|---|---|\n", len(refs), title)
	for i, m := range methods {
		med := median(results[i])
		fmt.Printf("| %s | %.2f s | %s | %.2f× |\n", m.name, med.Seconds(), runs(results[i]), float64(base)/float64(med))
	}
	fmt.Println()
	return nil
}

func crictlLoop(ctx context.Context, c *env.CRIO, refs []string) (time.Duration, error) {
	crictl := filepath.Join(env.CacheDir(), "crictl")
	start := time.Now()
	for _, r := range refs {
		out, err := exec.CommandContext(ctx, crictl, "--runtime-endpoint", "unix://"+c.Socket, "--timeout", "10m", "pull", r).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("crictl pull %s: %v: %s", r, err, out)
		}
	}
	return time.Since(start), nil
}

func criParallel(ctx context.Context, c *env.CRIO, refs []string, width int) (time.Duration, error) {
	client, err := cri.Dial("unix://" + c.Socket)
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

func (b *bench) startDaemon(c *env.CRIO, name string, concurrency int, unpinDelay string) (*daemon, error) {
	dir := filepath.Join(b.dir, name)
	d := &daemon{sets: filepath.Join(dir, "sets.d"), status: filepath.Join(dir, "status.json"), log: filepath.Join(dir, "imagepind.log")}
	os.MkdirAll(d.sets, 0o755)
	cfg := fmt.Sprintf("sets_dir = %q\nstate_dir = %q\nstatus_file = %q\nunpin_delay = %q\n[node]\nlabels_file = %q\n[cri]\nendpoint = \"unix://%s\"\npull_concurrency = %d\n[crio]\nconfig = %q\nconfig_dir = %q\nreload = \"signal\"\n",
		d.sets, filepath.Join(dir, "state"), d.status, unpinDelay, filepath.Join(dir, "labels.json"), c.Socket, concurrency, c.Config, c.ConfigDir) + c.DiskConfig()
	cfgPath := filepath.Join(dir, "imagepind.toml")
	os.WriteFile(cfgPath, []byte(cfg), 0o644)
	logf, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	d.cmd = exec.Command(filepath.Join(*binDir, "imagepind"), "--config", cfgPath)
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

func (b *bench) imagepind(ctx context.Context, c *env.CRIO, refs []string, concurrency int) (time.Duration, error) {
	d, err := b.startDaemon(c, filepath.Base(c.Dir)+"-d", concurrency, "2m")
	if err != nil {
		return 0, err
	}
	defer d.stop()
	start := time.Now()
	d.writeSet("bench", refs)
	if err := d.waitReady("bench"); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (b *bench) daemonLatencyAndIdle(ctx context.Context) error {
	c, err := b.freshCRIO(ctx, "crio-latency")
	if err != nil {
		return err
	}
	defer c.Cleanup()
	client, err := cri.Dial("unix://" + c.Socket)
	if err != nil {
		return err
	}
	defer client.Close()
	refs := b.refs(false)
	// Present but unpinned images to pin one at a time.
	for _, r := range refs[:min(*changes, len(refs))] {
		if _, err := client.PullImage(ctx, r, nil); err != nil {
			return err
		}
	}
	d, err := b.startDaemon(c, "latency", 0, "0s")
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
	fmt.Printf("Measured from the rename of the set file into the watched directory (includes the 250 ms debounce).\n\n")
	fmt.Printf("| p50 | p95 | min | max |\n|---|---|---|---|\n| %d ms | %d ms | %d ms | %d ms |\n\n",
		pct(lat, 50).Milliseconds(), pct(lat, 95).Milliseconds(), pct(lat, 0).Milliseconds(), pct(lat, 100).Milliseconds())
	fmt.Printf("imagepind's own reload→confirm times (its log, `pins confirmed ... took`): %s\n\n", confirmTimes(d.log))

	// Idle: 3 sets Ready, then a minute of nothing.
	third := len(refs) / 3
	d.writeSet("idle-a", refs[:third])
	d.writeSet("idle-b", refs[third:2*third])
	d.writeSet("idle-c", refs[2*third:])
	if err := d.waitReady("idle-a", "idle-b", "idle-c"); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	pid := d.cmd.Process.Pid
	cpu0, _ := cpuTicks(pid)
	crioLines0 := lineCount(c.LogFile)
	time.Sleep(*idleFor)
	cpu1, _ := cpuTicks(pid)
	crioLines1 := lineCount(c.LogFile)
	rss := env.RSSKiB(pid)
	anon, file := env.RSSParts(pid)
	cpuSec := float64(cpu1-cpu0) / 100
	fmt.Printf("## Idle, 3 sets Ready (%d images), over %s\n\n| RSS | of which anonymous / file | CPU time | CPU share of one core | CRI-O log lines (each CRI call logs one) |\n|---|---|---|---|---|\n| %.1f MiB | %.1f / %.1f MiB | %.2f s | %.3f%% | %d |\n\n",
		len(refs), idleFor.String(), float64(rss)/1024, float64(anon)/1024, float64(file)/1024, cpuSec, 100*cpuSec/idleFor.Seconds(), crioLines1-crioLines0)
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

// startSlowLink runs toxiproxy in front of the registry.
func (b *bench) startSlowLink() (func(), error) {
	apiPort, _ := env.FreePort()
	listenPort, _ := env.FreePort()
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
	b.proxied = fmt.Sprintf("127.0.0.1:%d", listenPort)
	if err := post("/proxies", map[string]any{"name": "registry", "listen": b.proxied, "upstream": b.reg.Host, "enabled": true}); err != nil {
		stop()
		return nil, err
	}
	for _, stream := range []string{"downstream", "upstream"} {
		if err := post("/proxies/registry/toxics", map[string]any{"name": "latency-" + stream, "type": "latency", "stream": stream, "attributes": map[string]int{"latency": *latency}}); err != nil {
			stop()
			return nil, err
		}
	}
	if err := post("/proxies/registry/toxics", map[string]any{"name": "bandwidth", "type": "bandwidth", "stream": "downstream", "attributes": map[string]int{"rate": *rateKBps}}); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}
