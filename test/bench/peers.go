package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
)

var (
	peerImages  = flag.Int("peer-images", 12, "images of the set for the peers section (the first of the 40)")
	peerNodes   = flag.String("peer-nodes", "1,3,5", "node counts for the peers section")
	peerLinks   = flag.String("peer-links", "25ms:4000:3,100ms:1000:1", "shared links for the peers section: latency:KB/s:repetitions")
	peerRuntime = flag.String("peer-runtime", "cri-o", "the peers section's runtime: cri-o or containerd")
	peerSet     = flag.String("peer-set", "bench", "the peers section's set: bench (the first -peer-images of the 40-image set) or release (shaped like a release payload: -peer-images images on two large shared base layers, one small layer each)")
)

// releaseShaped pushes n images shaped like a release payload's: every image on the
// same two large base layers (an OS and a runtime layer, 4 MiB and 2 MiB here), plus
// one small layer of its own (192 KiB: a component's binary).
func (b *bench) releaseShaped(ctx context.Context, n int) ([]env.Image, error) {
	var bases []v1.Layer
	for _, size := range []int64{4 << 20, 2 << 20} {
		l, err := env.RandomLayer(size)
		if err != nil {
			return nil, err
		}
		bases = append(bases, l)
	}
	var out []env.Image
	for i := range n {
		img, err := b.reg.PushRandom(ctx, fmt.Sprintf("release/component-%02d", i), 1, 192<<10, bases...)
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}

// sharedLink is a site's uplink: one token bucket for every node's connections.
type sharedLink struct {
	latency time.Duration
	kbps    int64
	reps    int
}

func parseLinks(s string) ([]sharedLink, error) {
	var out []sharedLink
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(part, ":")
		if len(f) != 3 {
			return nil, fmt.Errorf("-peer-links %q: latency:KB/s:reps", part)
		}
		lat, err1 := time.ParseDuration(f[0])
		kbps, err2 := strconv.ParseInt(f[1], 10, 64)
		reps, err3 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("-peer-links %q: latency:KB/s:reps", part)
		}
		out = append(out, sharedLink{lat, kbps, reps})
	}
	return out, nil
}

// peerRun is one measurement: how long until every node had the set, and what crossed
// the link.
type peerRun struct {
	took time.Duration
	down int64
}

// peers measures N nodes pre-loading one set behind one shared link: raw CRI pulls on
// every node, imagepind without peers, imagepind with peers.
func (b *bench) peers(ctx context.Context) error {
	links, err := parseLinks(*peerLinks)
	if err != nil {
		return err
	}
	var counts []int
	for _, s := range strings.Split(*peerNodes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("-peer-nodes %q", *peerNodes)
		}
		counts = append(counts, n)
	}
	imgs := b.imgs[:min(*peerImages, len(b.imgs))]
	if *peerSet == "release" {
		if imgs, err = b.releaseShaped(ctx, *peerImages); err != nil {
			return err
		}
	}
	ca, err := testcerts.NewCA(b.dir, "peers-ca")
	if err != nil {
		return err
	}
	modes := []string{"raw CRI pulls (8 in parallel) on every node", "imagepind, [peers] off", "imagepind, [peers] on"}
	for _, sl := range links {
		link, err := env.StartLink(b.reg.Host, sl.kbps*1000, sl.latency)
		if err != nil {
			return err
		}
		var refs []string
		for _, img := range imgs {
			refs = append(refs, strings.Replace(img.Ref(), b.reg.Host, link.Addr, 1))
		}
		results := map[string]map[int][]peerRun{}
		for _, m := range modes {
			results[m] = map[int][]peerRun{}
		}
		for rep := 0; rep < sl.reps; rep++ {
			for _, n := range counts {
				for mi, m := range modes {
					before := link.Down.Load()
					took, err := b.peerRound(ctx, link, refs, n, mi, ca, fmt.Sprintf("peers-%s-%d-%d-%d", sl.latency, rep, n, mi))
					if err != nil {
						link.Close()
						return fmt.Errorf("%s, %d nodes: %w", m, n, err)
					}
					r := peerRun{took, link.Down.Load() - before}
					results[m][n] = append(results[m][n], r)
					fmt.Fprintf(os.Stderr, "  peers / %s %d KB/s / %d nodes / %s: %s, %.1f MiB over the link\n", sl.latency, sl.kbps, n, m, took.Round(time.Millisecond), float64(r.down)/(1<<20))
				}
			}
		}
		link.Close()
		// One copy of the set: its distinct blobs and manifests.
		one, err := setBytes(ctx, imgs)
		if err != nil {
			return err
		}
		fmt.Printf("## P5 (%s set): %d nodes pre-load %d images behind one shared link (+%s latency a request, %d KB/s for all nodes together)\n\n",
			*peerSet, counts[len(counts)-1], len(refs), sl.latency, sl.kbps)
		fmt.Printf("One copy of the set (its distinct blobs and manifests, compressed): %.2f MiB. %d repetitions; medians. Every run: fresh %s nodes with empty storage.\n\n", float64(one)/(1<<20), sl.reps, *peerRuntime)
		fmt.Println("| method | nodes | until every node has the set | runs (s) | ÷ one node alone | bytes over the link ÷ one copy |")
		fmt.Println("|---|---|---|---|---|---|")
		for _, m := range modes {
			alone := medianTook(results[m][counts[0]])
			for _, n := range counts {
				rs := results[m][n]
				med := medianTook(rs)
				fmt.Printf("| %s | %d | %.2f s | %s | %.2f× | %.3f× |\n", m, n, med.Seconds(), runs(tooks(rs)), float64(med)/float64(alone), float64(medianDown(rs))/float64(one))
			}
		}
		fmt.Println()
	}
	for i, at := range peerRSSAt {
		rs := peerRSS[i]
		if len(rs) == 0 {
			continue
		}
		var rss, anon, file []time.Duration
		for _, r := range rs {
			rss, anon, file = append(rss, time.Duration(r.rss)), append(anon, time.Duration(r.anon)), append(file, time.Duration(r.file))
		}
		fmt.Printf("imagepind's resident memory with [peers] on, %s after the last node's set was Ready (every node of every round, %d readings): median %d KiB (anonymous %d, file-backed %d), max %d KiB.\n\n",
			at, len(rs), int64(median(rss)), int64(median(anon)), int64(median(file)), int64(pct(rss, 100)))
	}
	return nil
}

func tooks(rs []peerRun) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		out = append(out, r.took)
	}
	return out
}

func medianTook(rs []peerRun) time.Duration { return median(tooks(rs)) }

func medianDown(rs []peerRun) int64 {
	var ds []time.Duration
	for _, r := range rs {
		ds = append(ds, time.Duration(r.down))
	}
	return int64(median(ds))
}

// peerRound starts n fresh CRI-O nodes and has each pre-load refs (mode 0: raw CRI
// pulls; 1: imagepind; 2: imagepind with peers), all at once; it returns the time
// until the last node had the set.
func (b *bench) peerRound(ctx context.Context, link *env.Proxy, refs []string, n, mode int, ca *testcerts.CA, name string) (time.Duration, error) {
	port, err := env.FreePort()
	if err != nil {
		return 0, err
	}
	var addrs []string
	for i := range n {
		addrs = append(addrs, fmt.Sprintf("127.0.0.%d:%d", 2+i, port))
	}
	var nodes []*node
	defer func() {
		for _, c := range nodes {
			if *keep {
				c.stop()
			} else {
				c.cleanup()
			}
		}
	}()
	var daemons []*daemon
	defer func() {
		for _, d := range daemons {
			d.stop()
		}
	}()
	for i := range n {
		c, err := peerNode(ctx, filepath.Join(b.dir, name, fmt.Sprint(i)), link.Addr)
		if err != nil {
			return 0, err
		}
		nodes = append(nodes, c)
		if mode == 0 {
			continue
		}
		extra := ""
		if mode == 2 {
			dir := filepath.Join(b.dir, name, fmt.Sprint(i))
			node := fmt.Sprintf("node-%d", i)
			serving, err := ca.NodeServing(dir, node, net.ParseIP(fmt.Sprintf("127.0.0.%d", 2+i)))
			if err != nil {
				return 0, err
			}
			client, err := ca.Node(dir, node)
			if err != nil {
				return 0, err
			}
			mport, err := env.FreePort()
			if err != nil {
				return 0, err
			}
			extra = fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\naddress = %q\nnodes = [\"%s\"]\ncert = %q\nca = %q\nclient_cert = %q\nclient_ca = %q\nserve_mib_per_second = 0\n",
				mport, addrs[i], strings.Join(addrs, `", "`), serving, ca.File, client, ca.File)
		}
		// Each node runs its own copy of the executable, as on separate machines: N
		// processes of one file share its pages in the page cache, which each counts
		// in its RSS and which the kernel does not page out for one of them (idle.Trim's
		// MADV_PAGEOUT leaves pages mapped by several processes).
		exe := filepath.Join(b.dir, name, fmt.Sprint(i), "imagepind")
		if err := copyFile(filepath.Join(*binDir, "imagepind"), exe); err != nil {
			return 0, err
		}
		c.exe = exe
		d, err := b.startDaemon(c, filepath.Join(name, fmt.Sprint(i), "d"), 0, "2m", extra)
		if err != nil {
			return 0, err
		}
		daemons = append(daemons, d)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if mode == 0 {
				_, errs[i] = criParallel(ctx, nodes[i].socket, refs, 8)
				return
			}
			daemons[i].writeSet("bench", refs)
			errs[i] = daemons[i].waitReady("bench")
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	if mode == 2 {
		// imagepind with the set Ready and peers on: its resident memory 3 s after the
		// last node was Ready (some still serving others a moment before), and settled.
		for i, at := range peerRSSAt {
			time.Sleep(at - time.Since(start) + took)
			for _, d := range daemons {
				anon, file := env.RSSParts(d.cmd.Process.Pid)
				peerRSS[i] = append(peerRSS[i], rssReading{env.RSSKiB(d.cmd.Process.Pid), anon, file})
				fmt.Fprintf(os.Stderr, "  peers / %s: imagepind %d KiB anonymous + %d KiB file %s after Ready\n", name, anon, file, at)
			}
		}
	}
	return took, nil
}

// peerNode is a fresh node of -peer-runtime with empty storage, reaching registry over
// plain HTTP.
func peerNode(ctx context.Context, dir, registry string) (*node, error) {
	switch *peerRuntime {
	case "cri-o":
		c, err := env.NewCRIO(dir, env.CRIOOptions{Insecure: []string{registry}})
		if err != nil {
			return nil, err
		}
		if err := c.Start(ctx); err != nil {
			return nil, err
		}
		return &node{runtime: "cri-o", socket: c.Socket, crio: c}, nil
	case "containerd":
		c, err := env.NewContainerd(dir, env.ContainerdOptions{Insecure: []string{registry}})
		if err != nil {
			return nil, err
		}
		if err := c.Start(ctx); err != nil {
			c.Cleanup()
			return nil, err
		}
		return &node{runtime: "containerd", socket: c.Socket, ctr: c}, nil
	}
	return nil, fmt.Errorf("-peer-runtime %q: cri-o or containerd", *peerRuntime)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

// peerRSSAt are when imagepind's resident memory is read after a round with peers on
// (after the last node was Ready); peerRSS the readings, each node of each round.
var (
	peerRSSAt = []time.Duration{3 * time.Second, 15 * time.Second}
	peerRSS   = make([][]rssReading, len(peerRSSAt))
)

// rssReading is resident memory in KiB: all of it, anonymous, file-backed.
type rssReading struct{ rss, anon, file int64 }

// setBytes is the compressed size of the images' distinct manifests, configs and layers:
// one copy of the set.
func setBytes(ctx context.Context, imgs []env.Image) (int64, error) {
	seen := map[string]bool{}
	var total int64
	for _, img := range imgs {
		ref, err := name.NewDigest(img.Ref(), name.Insecure)
		if err != nil {
			return 0, err
		}
		desc, err := remote.Get(ref, remote.WithContext(ctx))
		if err != nil {
			return 0, err
		}
		total += int64(len(desc.Manifest))
		m, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
		if err != nil {
			return 0, err
		}
		for _, l := range append([]v1.Descriptor{m.Config}, m.Layers...) {
			if !seen[l.Digest.String()] {
				seen[l.Digest.String()] = true
				total += l.Size
			}
		}
	}
	return total, nil
}
