// Command scalebench is `make bench-scale`: sharing pinned blobs between N nodes, N up
// to hundreds, on one machine. Each node runs the daemon's own node-local mirror
// (package mirror, over a blob store on disk) with its peers.Source and the peers'
// HTTPS server (node certificates, one listener each on its own loopback address), as
// peers.Node builds them; no container runtime: each node reads every manifest and
// blob of its pinned images through its node-local mirror, as the runtime would, and
// checks each against its digest. Each node has its own upload and download bound
// (token buckets); all nodes reach the registry (go-containerregistry's, in process)
// through one shared link (one token bucket for all, latency added to each request,
// test/env.StartLink). The nodes run in worker processes (worker.go), each reaching
// its mirror in memory (pipe.go); the bench keeps the registry and the link. It
// prints, per N and mode, the time until every node holds the
// set ÷ one node alone, the registry's egress and the most any node uploaded ÷ one
// copy of the set, and the nodes' median and p90 finish times. It ends with the Goals
// table (goals.go), even when a run stopped on an error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/imagepin/imagepin/peers"
	"github.com/imagepin/imagepin/pullwidth"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/goals"
	"github.com/imagepin/imagepin/test/testcerts"
)

var (
	nodesFlag  = flag.String("nodes", "5,50,200", "node counts (N = 1, one node alone, is always run first)")
	reps       = flag.Int("reps", 3, "repetitions of each N (medians)")
	onceFrom   = flag.Int("once-from", 200, "N at or above this is run once")
	modesFlag  = flag.String("modes", "star,tree", "star (every node reads a blob from the first in its order) and/or tree (a k-ary tree over the order: -fanout)")
	fanout     = flag.Int("fanout", peers.DefaultFanout, "the tree's fanout")
	bases      = flag.Int("bases", 1, "shared base layers (each image is on one of them)")
	baseMiB    = flag.Int64("base-mib", 16, "size of each base layer, MiB (a 1 GiB OS layer scaled by 1/64)")
	allBases   = flag.String("all-bases-kib", "", "base layers every image is on, KiB each, comma-separated (a release payload's shape: 4096,2048); replaces -bases and -base-mib")
	images     = flag.Int("images", 30, "images in the set")
	layers     = flag.Int("layers", 1, "layers of its own per image")
	layerKiB   = flag.Int64("layer-kib", 64, "size of each image's own layers, KiB (4 MiB scaled by 1/64)")
	linkLat    = flag.Duration("link-latency", 50*time.Millisecond, "latency the shared registry link adds to each request")
	linkKBps   = flag.Int64("link-kbps", 1950, "the shared registry link, KB/s for all nodes together (0: none; 1 Gbit/s scaled by 1/64)")
	upKBps     = flag.Int64("up-kbps", 19500, "each node's upload, KB/s (0: none; 10 Gbit/s scaled by 1/64)")
	downKBps   = flag.Int64("down-kbps", 19500, "each node's download, KB/s (0: none; 10 Gbit/s scaled by 1/64)")
	maxServing = flag.Int("max-serving", 64, "[peers] max_serving of each node")
	serveMiB   = flag.Int64("serve-mib", 0, "[peers] serve_mib_per_second of each node (0: none; the node's upload bounds it anyway)")
	pullWidth  = flag.Int("pull-width", pullwidth.DefaultWidest, "images each node pulls at once (imagepind's widest: it starts there behind a far registry)")
	stagger    = flag.Duration("stagger", 0, "nodes join spread over this long (node i at i/N of it; 0: all at once)")
	timeout    = flag.Duration("timeout", 20*time.Minute, "bound on one run")
	dirFlag    = flag.String("dir", os.TempDir(), "where the nodes' blob stores go (removed at the end)")
	verbose    = flag.Bool("v", false, "print the first warnings the nodes logged in each run")
	perProcess = flag.Int("per-process", 50, "nodes in each worker process (each process has a table of open files of its own, as each node does)")
	cpuProfile = flag.String("cpuprofile", "", "each worker writes a CPU profile of its nodes' pulls to this path + its first node's index")
	workerMode = flag.Bool("worker", false, "run as a worker process (the bench starts them)")
	release    = flag.Bool("release", false, "mimic docs/numbers.md's release-shaped set on real CRI-O nodes (test/bench -peer-set release -peer-images 40 -peer-links 100ms:1000:1, no per-node bounds): sets the flags not given")
	slow       = flag.Float64("slow", 1, "slow every link by this factor: the registry link's and each node's rates divided by it, the registry link's latency multiplied (so that the machine's CPU is not what a run measures; a run whose machine is more than 80% busy does not count)")
	p5         = flag.Bool("p5", false, "mimic docs/numbers.md P5 (test/bench -peer-links 100ms:1000:1, its 12-image set, no per-node bounds): sets the flags not given")
)

// p5Flags are test/bench's P5 peers section: the first 12 images of its 40-image set
// (3 base layers of 1 MiB, two 512 KiB layers of their own each), behind 100 ms and
// 1 MB/s for all nodes together, nodes on loopback (no bounds of their own),
// serve_mib_per_second = 0, imagepind's pull width.
var p5Flags = map[string]string{
	"nodes": "5", "reps": "1", "modes": "star", "bases": "3", "base-mib": "1", "images": "12", "layers": "2", "layer-kib": "512",
	"link-latency": "100ms", "link-kbps": "1000", "up-kbps": "0", "down-kbps": "0", "serve-mib": "0",
}

// releaseFlags are test/bench's peers section with -peer-set release: 40 images each
// on the same two base layers (4 MiB and 2 MiB) with one 192 KiB layer of its own,
// behind 100 ms and 1 MB/s for all nodes together, nodes on loopback, the tree.
var releaseFlags = map[string]string{
	"nodes": "5", "reps": "1", "modes": "tree", "all-bases-kib": "4096,2048", "images": "40", "layers": "1", "layer-kib": "192",
	"link-latency": "100ms", "link-kbps": "1000", "up-kbps": "0", "down-kbps": "0", "serve-mib": "0",
}

func main() {
	flag.Parse()
	// The peer servers' own log (http.Server.ErrorLog: a TLS handshake cut short, as
	// the probe of a node's listener makes) is noise here; the nodes' warnings are
	// counted (-v prints them).
	log.SetOutput(io.Discard)
	for _, preset := range []struct {
		on    bool
		flags map[string]string
	}{{*p5, p5Flags}, {*release, releaseFlags}} {
		if !preset.on {
			continue
		}
		given := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
		for k, v := range preset.flags {
			if !given[k] {
				flag.Set(k, v)
			}
		}
	}
	raiseFileLimit()
	if !*workerMode && *slow != 1 {
		if *slow <= 0 {
			fmt.Fprintln(os.Stderr, "scalebench: -slow must be more than 0")
			os.Exit(2)
		}
		for _, r := range []*int64{linkKBps, upKBps, downKBps} {
			if *r > 0 { // 0: unbounded, and stays so
				*r = max(1, int64(float64(*r) / *slow))
			}
		}
		*linkLat = time.Duration(float64(*linkLat) * *slow)
	}
	if *workerMode {
		if err := runWorker(); err != nil {
			fmt.Fprintln(os.Stderr, "scalebench worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		os.Exit(1)
	}
}

// result is one run.
type result struct {
	took     time.Duration   // until every node held the set
	finishes []time.Duration // each node's, from its join
	egress   int64           // bytes the registry link carried
	maxUp    int64           // the most any node sent its peers
	retries  int
	setAside int64
	cpu      float64 // the bench's CPU time ÷ (wall × cores)
	load     string  // the machine's load average at the end (other work on it)
	busy     float64 // the machine's CPU busy over the run, all processes ÷ (wall × cores)
	rssKiB   int64
	fds      fdCensus // the most open files sampled in one worker process, by kind
	procs    int      // worker processes
	ups      []int64  // what each node sent its peers
	asideWhy map[string]int64
	// connEvents are what ended or broke the nodes' peer connections.
	connEvents map[string]int64
	// registryDone is when the link had carried 99% of its bytes of the run.
	registryDone time.Duration
	// tcp are the machine's TCP counters over the run (/proc/net/netstat: a listener's
	// queue overflowing, SYNs sent again); slow are the requests to peers that timed
	// out (dial, handshake, answer) and were asked again, not set aside.
	tcp   map[string]int64
	slow  int64
	dials int64 // connections the nodes dialled to peers
	// purposes are the requests to peers, the connections and handshakes they made, by
	// what they were for (held summaries, manifests, blobs).
	purposes map[string]purposeCount
	// done are the nodes holding the set when the run ended (-timeout: all of them, or
	// the run was cut there).
	done int
}

func run() error {
	var counts []int
	for _, s := range strings.Split(*nodesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-nodes %q", *nodesFlag)
		}
		if n > 1 && !slices.Contains(counts, n) {
			counts = append(counts, n)
		}
	}
	counts = append([]int{1}, counts...)
	modes := strings.Split(*modesFlag, ",")
	treeNote := ""
	if slices.Contains(modes, "tree") && !setFanout(&peers.Source{}, *fanout) {
		modes = slices.DeleteFunc(modes, func(m string) bool { return m == "tree" })
		treeNote = "peers.Source has no Fanout yet: every node reads a blob from the first in its order (the star); the tree rows are left out (setFanout in test/scalebench/node.go)."
	}
	if len(modes) == 0 {
		return fmt.Errorf("-modes %q: nothing to run", *modesFlag)
	}
	var baseSizes []int64
	perImage := 1 // shared base layers each image is on
	if *allBases == "" {
		for range *bases {
			baseSizes = append(baseSizes, *baseMiB<<20)
		}
	} else {
		for _, f := range strings.Split(*allBases, ",") {
			kib, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil || kib < 1 {
				return fmt.Errorf("-all-bases-kib %q: %q is not a size in KiB", *allBases, f)
			}
			baseSizes = append(baseSizes, kib<<10)
		}
		perImage = len(baseSizes)
	}

	// The Goals table ends the output, whatever happens from here.
	var s set
	var failed failedRun
	results := map[string]map[int][]result{}
	for _, m := range modes {
		results[m] = map[int][]result{}
	}
	var largest int64
	if len(baseSizes) > 0 {
		largest = slices.Max(baseSizes)
	}
	g := scaleGoals(counts, modes, largest, *images == 1 && *layers == 0 && len(baseSizes) == 1)
	defer func() {
		recordGoals(g, results, s.bytes, largest, failed)
		g.Print(os.Stdout)
	}()

	dir, err := os.MkdirTemp(*dirFlag, "imagepin-scalebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	reg, err := startRegistry(filepath.Join(dir, "registry"))
	if err != nil {
		return err
	}
	defer reg.close()
	s, err = reg.makeSet(baseSizes, perImage, *images, *layers, *layerKiB<<10)
	if err != nil {
		return err
	}
	link, err := env.StartLink(reg.host, *linkKBps*1000, *linkLat)
	if err != nil {
		return err
	}
	defer link.Close()
	// The images as the nodes pin them: by the link's address.
	pinned := map[string]bool{}
	for i := range s.images {
		s.images[i].repo = link.Addr + "/" + s.images[i].repo
		pinned[s.images[i].repo+"@"+s.images[i].manifest.String()] = true
	}
	confDir := filepath.Join(dir, "conf")
	os.MkdirAll(filepath.Join(confDir, "empty"), 0o755)
	regConf := filepath.Join(confDir, "registries.conf")
	if err := os.WriteFile(regConf, fmt.Appendf(nil, "[[registry]]\nlocation = %q\ninsecure = true\n", link.Addr), 0o644); err != nil {
		return err
	}
	ca, err := testcerts.NewCA(confDir, "nodes-ca")
	if err != nil {
		return err
	}
	var certs []creds

	fmt.Fprintf(os.Stderr, "scalebench: set of %d images, %.2f MiB; link %s + %d KB/s; nodes up %d KB/s, down %d KB/s (links slowed %g×)\n",
		len(s.images), float64(s.bytes)/(1<<20), *linkLat, *linkKBps, *upKBps, *downKBps, *slow)
	var peakRSS int64
	for _, n := range counts {
		for len(certs) < n {
			i := len(certs)
			ip := fmt.Sprintf("127.10.%d.%d", i/250, 1+i%250)
			name := fmt.Sprintf("node-%d", i)
			serving, err := ca.NodeServing(confDir, name, net.ParseIP(ip))
			if err != nil {
				return err
			}
			client, err := ca.Node(confDir, name)
			if err != nil {
				return err
			}
			certs = append(certs, creds{IP: ip, Serving: serving, Client: client})
		}
		r := *reps
		if n >= *onceFrom {
			r = 1
		}
		for rep := range r {
			for mi, m := range modes {
				if n == 1 && mi > 0 {
					// One node alone is the same in every mode.
					results[m][1] = append(results[m][1], results[modes[0]][1][rep])
					continue
				}
				k := n // the star: every node reads from the first
				if m == "tree" {
					k = *fanout
				}
				res, err := runOnce(filepath.Join(dir, fmt.Sprintf("run-%s-%d-%d", m, n, rep)), n, k, s, link, certs, ca.File, regConf, filepath.Join(confDir, "empty"), pinned)
				if err != nil {
					failed = failedRun{m, n}
					return fmt.Errorf("%s, N=%d: %w", m, n, err)
				}
				peakRSS = max(peakRSS, res.rssKiB)
				results[m][n] = append(results[m][n], res)
				fmt.Fprintf(os.Stderr, "  %s N=%d rep %d: %d/%d nodes hold the set after %s, registry %.3f× a copy, max upload %.2f× a copy, median node %s, p90 %s, %d retries, %d set aside, %d asked again as slow, CPU %.0f%% (machine busy %.0f%%%s, links slowed %g×), RSS %d MiB, load %s\n",
					m, n, rep, res.done, n, res.took.Round(time.Millisecond), float64(res.egress)/float64(s.bytes), float64(res.maxUp)/float64(s.bytes),
					pct(res.finishes, 50).Round(time.Millisecond), pct(res.finishes, 90).Round(time.Millisecond), res.retries, res.setAside, res.slow, res.cpu*100, res.busy*100, notCounting(res.busy), *slow, res.rssKiB>>10, res.load)
				fmt.Fprintf(os.Stderr, "    %d connections dialled to peers; TCP over the run (whole machine): %s\n", res.dials, tcpString(res.tcp))
				fmt.Fprintf(os.Stderr, "    requests to peers by purpose: %s\n", purposeString(res.purposes))
				fmt.Fprintf(os.Stderr, "    %d worker process(es); open files in one at most: %s\n", res.procs, res.fds)
				fmt.Fprintf(os.Stderr, "    uploads ÷ one copy: %s; the registry link had carried 99%% of its bytes after %s\n",
					uploads(res.ups, s.bytes), res.registryDone.Round(250*time.Millisecond))
				if len(res.connEvents) > 0 {
					fmt.Fprintf(os.Stderr, "    peer connections ended or broken: %v\n", res.connEvents)
				}
				if len(res.asideWhy) > 0 {
					fmt.Fprintf(os.Stderr, "    peers set aside: %v\n", res.asideWhy)
				}
			}
		}
	}
	report(modes, counts, results, s, peakRSS, treeNote)
	return nil
}

// runOnce starts n fresh nodes with empty stores, spread over worker processes
// (worker.go), and has each pull the set.
func runOnce(dir string, n, k int, s set, link *env.Proxy, certs []creds, caFile, regConf, emptyDir string, pinned map[string]bool) (result, error) {
	defer os.RemoveAll(dir)
	port, err := env.FreePort()
	if err != nil {
		return result{}, err
	}
	addrs := make([]string, n)
	for i := range n {
		addrs[i] = net.JoinHostPort(certs[i].IP, strconv.Itoa(port))
	}
	var pins []string
	for p := range pinned {
		pins = append(pins, p)
	}
	var refs []imageRef
	for _, img := range s.images {
		refs = append(refs, imageRef{Repo: img.repo, Manifest: img.manifest})
	}
	procs := (n + *perProcess - 1) / *perProcess
	workers := make([]*worker, 0, procs)
	defer func() {
		for _, w := range workers {
			w.kill()
		}
	}()
	for p := range procs {
		lo, hi := p*n/procs, (p+1)*n/procs
		w, err := startWorker(workerSpec{Dir: dir, Lo: lo, Hi: hi, N: n, Addrs: addrs, Creds: certs[lo:hi], CA: caFile, RegistryConf: regConf,
			EmptyDir: emptyDir, Pinned: pins, Images: refs, MaxServing: *maxServing, ServeBPS: *serveMiB << 20, UpBPS: *upKBps * 1000,
			DownBPS: *downKBps * 1000, Fanout: k, PullWidth: *pullWidth, Stagger: *stagger, Timeout: *timeout,
			Ports: fdPorts{Peer: port, Link: portOf(link.Addr), Registry: portOf(s.registry)}})
		if err != nil {
			return result{}, err
		}
		workers = append(workers, w)
	}
	for _, w := range workers {
		if err := w.expect("ready", nil); err != nil {
			return result{}, err
		}
	}
	// Every worker starts its nodes at the same instant.
	start := time.Now().Add(100 * time.Millisecond)
	egress0 := link.Down.Load()
	cpu0 := cpuTime()
	busy0, all0 := goals.MachineCPU()
	tcp0 := tcpCounters()
	for _, w := range workers {
		if err := w.send(fmt.Sprintf("go %d", start.UnixNano())); err != nil {
			return result{}, err
		}
	}
	// The link's bytes over time: when the registry had sent (nearly) all it sent.
	type sample struct {
		at    time.Duration
		bytes int64
	}
	var linkSamples []sample
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				linkSamples = append(linkSamples, sample{time.Since(start), link.Down.Load() - egress0})
			}
		}
	}()
	dones := make([]workerDone, len(workers))
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.expect("done", &dones[i])
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	res := result{took: took, egress: link.Down.Load() - egress0, load: loadavg(), procs: len(workers), rssKiB: rssKiB()}
	close(stopSampling)
	<-sampled
	for _, sm := range linkSamples {
		if sm.bytes >= res.egress*99/100 {
			res.registryDone = sm.at
			break
		}
	}
	res.tcp = tcpCounters()
	for k, v := range tcp0 {
		res.tcp[k] -= v
	}
	if busy1, all1 := goals.MachineCPU(); all1 > all0 {
		res.busy = float64(busy1-busy0) / float64(all1-all0)
	}
	cpu := cpuTime() - cpu0
	var nodeErrs []error
	for _, d := range dones {
		cpu += d.CPU
		res.rssKiB += d.RSSKiB
		if d.FDs.total() > res.fds.total() {
			res.fds = d.FDs
		}
		for _, r := range d.Nodes {
			res.retries += r.Retries
			if r.Done {
				res.done++
				res.finishes = append(res.finishes, r.Finish)
			} else if r.Err != "" {
				nodeErrs = append(nodeErrs, errors.New(r.Err))
			}
		}
	}
	res.cpu = cpu.Seconds() / (took.Seconds() * float64(runtime.NumCPU()))
	var samples, climbed []string
	var served []servedEntry
	for _, w := range workers {
		if err := w.send("stop"); err != nil {
			return result{}, err
		}
		var f workerFinal
		if err := w.expect("final", &f); err != nil {
			return result{}, err
		}
		for _, up := range f.ToPeers {
			res.maxUp = max(res.maxUp, up)
			res.ups = append(res.ups, up)
		}
		res.setAside += f.SetAside
		res.slow += f.Slow
		res.dials += f.Dials
		for k, v := range f.Purposes {
			if res.purposes == nil {
				res.purposes = map[string]purposeCount{}
			}
			c := res.purposes[k]
			c.Requests += v.Requests
			c.Failed += v.Failed
			c.Dials += v.Dials
			c.Handshakes += v.Handshakes
			c.HandFailed += v.HandFailed
			c.HandNanos += v.HandNanos
			res.purposes[k] = c
		}
		for k, v := range f.ConnEvents {
			if res.connEvents == nil {
				res.connEvents = map[string]int64{}
			}
			res.connEvents[k] += v
		}
		for k, v := range f.AsideWhy {
			if res.asideWhy == nil {
				res.asideWhy = map[string]int64{}
			}
			res.asideWhy[k] += v
		}
		samples = append(samples, f.Samples...)
		climbed = append(climbed, f.Climbed...)
		served = append(served, f.Served...)
	}
	for _, w := range workers {
		if err := w.wait(); err != nil {
			return result{}, fmt.Errorf("worker %d: %w", w.cmd.Process.Pid, err)
		}
	}
	workers = nil
	err = errors.Join(nodeErrs...)
	if err != nil || *verbose {
		for _, w := range samples[:min(len(samples), 5)] {
			fmt.Fprintln(os.Stderr, "   ", w)
		}
		if len(climbed) > 0 {
			fmt.Fprintf(os.Stderr, "    asked the registry for a blob their tree's head sends (the first %d of each worker):\n", climbedKept)
			for _, c := range climbed {
				fmt.Fprintln(os.Stderr, "     ", c)
			}
		}
		sizes := map[string]int64{}
		for _, img := range s.images {
			for _, b := range img.blobs {
				sizes[b.Digest.String()] = b.Size
			}
		}
		fmt.Fprint(os.Stderr, uploadsExplained(served, addrs, k, sizes))
	}
	return res, err
}

func report(modes []string, counts []int, results map[string]map[int][]result, s set, peakRSS int64, treeNote string) {
	fmt.Printf("## Sharing at scale (test/scalebench): N simulated nodes behind one shared registry link\n\n")
	fmt.Printf("`go run ./test/scalebench %s`, %s, %d cores.\n\n", strings.Join(os.Args[1:], " "), time.Now().UTC().Format("2006-01-02"), runtime.NumCPU())
	bases := fmt.Sprintf("on one of %d shared base layer(s) of %d MiB", *bases, *baseMiB)
	if *allBases != "" {
		bases = fmt.Sprintf("each on the shared base layers of %s KiB", *allBases)
	}
	fmt.Printf("The set: %d images, %s, %d layer(s) of %d KiB of their own each: one copy %.2f MiB (distinct blobs and manifests). "+
		"Registry link: +%s a request, %d KB/s for all nodes together. Each node: upload %s, download %s; max_serving %d. Medians over %d repetitions (N ≥ %d: one).\n\n",
		len(s.images), bases, *layers, *layerKiB, float64(s.bytes)/(1<<20), *linkLat, *linkKBps, kbps(*upKBps), kbps(*downKBps), *maxServing, *reps, *onceFrom)
	if *stagger > 0 {
		fmt.Printf("Nodes join spread over %s; a node's finish time is from its own join.\n\n", *stagger)
	}
	if treeNote != "" {
		fmt.Printf("%s\n\n", treeNote)
	}
	fmt.Printf("Links slowed %g× (-slow). A row whose machine was more than %d%% busy (median of its runs) measures the machine, not the protocol: it is marked as not counting.\n\n", *slow, goals.BusyBound)
	fmt.Println("| mode | N | nodes holding the set | until every node holds the set | runs (s) | ÷ one node alone | spread (min–max ÷ one node) | registry egress ÷ one copy | most uploaded by a node ÷ one copy | node finish median | p90 | retries | peers set aside | asked again as slow | connections dialled to peers | listen overflows, SYNs sent again | bench CPU | machine CPU busy | links slowed | bench RSS | machine load | processes | most open files in one |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, m := range modes {
		alone := median(tooks(results[m][1]))
		for _, n := range counts {
			rs := results[m][n]
			if len(rs) == 0 {
				continue
			}
			med := median(tooks(rs))
			var runs []string
			var egress, up, p50, p90 []float64
			var retries, aside, slows []float64
			var overflows, synRe, dials []float64
			var cpu, busy []float64
			var rss int64
			var loads []string
			procs, files := 0, 0
			done := n
			for _, r := range rs {
				runs = append(runs, fmt.Sprintf("%.2f", r.took.Seconds()))
				egress = append(egress, float64(r.egress)/float64(s.bytes))
				up = append(up, float64(r.maxUp)/float64(s.bytes))
				p50 = append(p50, pct(r.finishes, 50).Seconds())
				p90 = append(p90, pct(r.finishes, 90).Seconds())
				retries = append(retries, float64(r.retries))
				aside = append(aside, float64(r.setAside))
				slows = append(slows, float64(r.slow))
				dials = append(dials, float64(r.dials))
				overflows = append(overflows, float64(r.tcp["ListenOverflows"]))
				synRe = append(synRe, float64(r.tcp["TCPSynRetrans"]))
				cpu = append(cpu, r.cpu)
				busy = append(busy, r.busy)
				rss = max(rss, r.rssKiB)
				loads = append(loads, r.load)
				done = min(done, r.done)
				procs = max(procs, r.procs)
				files = max(files, r.fds.total())
			}
			until := fmt.Sprintf("%.2f s", med.Seconds())
			if done < n {
				until = fmt.Sprintf("not within %s", *timeout)
			}
			ts := tooks(rs)
			spread := fmt.Sprintf("%.2f–%.2f×", float64(slices.Min(ts))/float64(alone), float64(slices.Max(ts))/float64(alone))
			fmt.Printf("| %s | %d | %d | %s | %s | %.2f× | %s | %.3f× | %.2f× | %.2f s | %.2f s | %.0f | %.0f | %.0f | %.0f | %.0f, %.0f | %.0f%% | %.0f%%%s | %g× | %d MiB | %s | %d | %d |\n",
				m, n, done, until, strings.Join(runs, ", "), float64(med)/float64(alone), spread, goals.Median(egress), goals.Median(up),
				goals.Median(p50), goals.Median(p90), goals.Median(retries), goals.Median(aside), goals.Median(slows), goals.Median(dials), goals.Median(overflows), goals.Median(synRe),
				goals.Median(cpu)*100, goals.Median(busy)*100, notCounting(goals.Median(busy)), *slow, rss>>10, strings.Join(loads, ", "), procs, files)
		}
	}
	fmt.Printf("\nBench resident memory (the bench and its workers together): at most %d MiB (measured when the nodes hold the set, before they stop). "+
		"The nodes run in worker processes of at most %d nodes each (-per-process), each with its own table of open files, as each real node has; "+
		"a simulated runtime reaches its node's mirror in memory.\n\n", peakRSS>>10, *perProcess)
}

// uploads sorts what the nodes uploaded by copies of the set: how many nodes sent up
// to ½, 1, 1½, 2, 3 and more copies.
func uploads(ups []int64, copy int64) string {
	bounds := []float64{0.5, 1, 1.5, 2, 3}
	counts := make([]int, len(bounds)+1)
	for _, u := range ups {
		i, c := 0, float64(u)/float64(copy)
		for i < len(bounds) && c > bounds[i] {
			i++
		}
		counts[i]++
	}
	var parts []string
	for i, n := range counts {
		if i < len(bounds) {
			parts = append(parts, fmt.Sprintf("≤%g: %d", bounds[i], n))
		} else {
			parts = append(parts, fmt.Sprintf(">%g: %d", bounds[len(bounds)-1], n))
		}
	}
	return strings.Join(parts, ", ") + " nodes"
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

func kbps(v int64) string {
	if v == 0 {
		return "unbounded"
	}
	return fmt.Sprintf("%d KB/s", v)
}

func tooks(rs []result) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		out = append(out, r.took)
	}
	return out
}

func median(ds []time.Duration) time.Duration { return pct(ds, 50) }

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// notCounting marks a machine busy share above goals.BusyBound: the run measures the
// machine, not the protocol.
func notCounting(busy float64) string {
	if !goals.Counts(busy) {
		return fmt.Sprintf(" (not counting: machine over %d%% busy)", goals.BusyBound)
	}
	return ""
}

// tcpCounters are the machine's TCP counters that tell a listener overflowing
// (/proc/net/netstat TcpExt: ListenOverflows, ListenDrops, TCPReqQFullDrop) and SYNs
// sent again (TCPSynRetrans: a dial whose SYN was dropped waits 1 s, then 2 s more).
func tcpCounters() map[string]int64 {
	out := map[string]int64{}
	data, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return out
	}
	lines := strings.Split(string(data), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != "TcpExt:" || len(values) != len(names) {
			continue
		}
		for j, n := range names {
			switch n {
			case "ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPSynRetrans", "TCPTimeouts":
				out[n], _ = strconv.ParseInt(values[j], 10, 64)
			}
		}
	}
	return out
}

func tcpString(c map[string]int64) string {
	var keys []string
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, c[k]))
	}
	return strings.Join(parts, ", ")
}

// loadavg is the machine's one-minute load average.
func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(data))[0]
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssKiB is this process's resident memory (VmRSS).
func rssKiB() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// raiseFileLimit lifts the process's open-file limit as far as it may go (with
// CAP_SYS_RESOURCE: to the kernel's fs.nr_open; without it, the soft limit to the
// hard one). A worker's nodes share one limit, where real nodes have one each (both
// ends of their peer connections count here, and each node's store files): a process
// out of files fails its accepts, its dials and its store's writes alike, and
// measures that; -per-process bounds how many nodes share one.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return
	}
	want := l
	if data, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil && n > want.Max {
			want.Max = n
		}
	}
	want.Cur = want.Max
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) != nil {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	if *workerMode {
		return
	}
	fmt.Fprintf(os.Stderr, "scalebench: up to %d open files\n", l.Cur)
}
