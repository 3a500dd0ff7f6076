package main

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/goals"
	"github.com/imagepin/imagepin/test/testcerts"
)

var (
	seedSizes  = flag.String("seed-mib", "512,2048", "archive sizes for the seed section, MiB (\"\": only the nodes Ready from one seed)")
	seedNodes  = flag.Bool("seed-ready", true, "in the seed section, also 3 nodes Ready from one seed against from the registry")
	seedBefore = flag.String("seed-before", "", "in the seed section, also time this imagepinctl (an earlier build) in the same runs, as \"before\"")
)

// seedLayer is the size of each layer of the seed section's archives.
const seedLayer = 64 << 20

// seedBench measures `imagepinctl seed` (the real binary) on OCI archives of each size:
// its throughput against `cp` of the same archive on the same disk, and its largest
// RSS, from the process's rusage.
func (b *bench) seedBench(ctx context.Context) error {
	ctl := filepath.Join(*binDir, "imagepinctl")
	if _, err := os.Stat(ctl); err != nil {
		return fmt.Errorf("seed: %w (make build)", err)
	}
	dir := filepath.Join(b.dir, "seed")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if *seedSizes == "" {
		return b.seedReady(ctx)
	}
	fmt.Printf("## Seeding: `imagepinctl seed` of an OCI archive, against `sha256sum` and `cp` of the same archive\n\n")
	fmt.Printf("One image of %d MiB layers of random bytes in an OCI layout tar, on the same filesystem as the store and the copy (%s). ", seedLayer>>20, dir)
	fmt.Printf("`sha256sum` reads and hashes every byte of the archive once (the floor: a seed hashes every byte); `cp` copies the archive; `cp + sync` also flushes it to disk, as the store's commits do. Each run seeds into an empty store. %d repetitions; medians; ratios are throughputs (time of the other ÷ time of the seed).\n\n", *reps)
	before := *seedBefore
	if before != "" {
		if _, err := os.Stat(before); err != nil {
			return fmt.Errorf("-seed-before: %w", err)
		}
		fmt.Printf("Before: %s, timed in the same runs. ", before)
	}
	fmt.Printf("Each run: `sha256sum`, `cp`, `cp + sync`, the seed%s, each starting after a `sync`.\n\n", map[bool]string{true: " and the seed before (taking turns at going first)", false: ""}[before != ""])
	fmt.Printf("| archive | sha256sum | cp | cp + sync | imagepinctl seed | seed ÷ sha256sum (goal ≥ 0.8) | seed ÷ cp | seed ÷ (cp + sync) | seed max RSS (goal ≤ 64 MiB) | cp max RSS |")
	if before != "" {
		fmt.Printf(" seed before | before ÷ sha256sum | before ÷ cp | before max RSS |")
	}
	fmt.Printf("\n|---|---|---|---|---|---|---|---|---|---|%s\n", map[bool]string{true: "---|---|---|---|", false: ""}[before != ""])
	var lines []string
	for _, s := range strings.Split(*seedSizes, ",") {
		mib, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || mib < 64 {
			return fmt.Errorf("-seed-mib %q: sizes of at least 64 MiB", s)
		}
		archive := filepath.Join(dir, fmt.Sprintf("release-%d.tar", mib))
		size, err := writeSeedArchive(archive, int64(mib)<<20)
		if err != nil {
			return err
		}
		var sums, cps, syncs, seeds, befores []time.Duration
		var seedRSS, cpRSS, beforeRSS int64
		// seedOnce seeds archive with ctl into an empty store, after a sync (what the
		// run before left dirty is not this run's to write).
		seedOnce := func(ctl, name string) (time.Duration, int64, error) {
			exec.CommandContext(ctx, "sync").Run()
			state := filepath.Join(dir, fmt.Sprintf("state-%d-%s", mib, name))
			cfg := filepath.Join(dir, "imagepind.toml")
			if err := os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\n[peers]\nenabled = true\n", state), 0o644); err != nil {
				return 0, 0, err
			}
			took, rss, err := timed(exec.CommandContext(ctx, ctl, "seed", "--config", cfg, archive))
			if err != nil {
				return 0, 0, fmt.Errorf("%s seed %s: %w", ctl, archive, err)
			}
			return took, rss, os.RemoveAll(state)
		}
		for r := range *reps {
			dst := filepath.Join(dir, "copy.tar")
			exec.CommandContext(ctx, "sync").Run()
			took, _, err := timed(exec.CommandContext(ctx, "sha256sum", archive))
			if err != nil {
				return err
			}
			sums = append(sums, took)
			exec.CommandContext(ctx, "sync").Run()
			took, rss, err := timed(exec.CommandContext(ctx, "cp", archive, dst))
			if err != nil {
				return err
			}
			cps = append(cps, took)
			cpRSS = max(cpRSS, rss)
			os.Remove(dst)
			exec.CommandContext(ctx, "sync").Run()
			took, _, err = timed(exec.CommandContext(ctx, "sh", "-c", `cp "$1" "$2" && sync -f "$2"`, "sh", archive, dst))
			if err != nil {
				return err
			}
			syncs = append(syncs, took)
			os.Remove(dst)

			// The seed and the one before take turns at going first.
			line := fmt.Sprintf("  seed %d MiB: sha256sum %s, cp %s, cp+sync %s", mib, sums[r].Round(time.Millisecond), cps[r].Round(time.Millisecond), syncs[r].Round(time.Millisecond))
			order := []string{"seed", "before"}
			if before == "" {
				order = order[:1]
			} else if r%2 == 1 {
				order = []string{"before", "seed"}
			}
			for _, which := range order {
				exe, list, most := ctl, &seeds, &seedRSS
				if which == "before" {
					exe, list, most = before, &befores, &beforeRSS
				}
				took, rss, err := seedOnce(exe, which)
				if err != nil {
					return err
				}
				*list = append(*list, took)
				*most = max(*most, rss)
				line += fmt.Sprintf(", %s %s (RSS %d MiB)", which, took.Round(time.Millisecond), rss>>20)
			}
			fmt.Fprintln(os.Stderr, line)
		}
		sum, cp, sy, sd := median(sums), median(cps), median(syncs), median(seeds)
		fmt.Printf("| %d MiB | %s (%.0f MiB/s) | %s (%.0f MiB/s) | %s (%.0f MiB/s) | %s (%.0f MiB/s) | **%.2f** | %.2f | %.2f | **%.1f MiB** | %.1f MiB |", size>>20,
			sum.Round(time.Millisecond), mibps(size, sum), cp.Round(time.Millisecond), mibps(size, cp), sy.Round(time.Millisecond), mibps(size, sy), sd.Round(time.Millisecond), mibps(size, sd),
			sum.Seconds()/sd.Seconds(), cp.Seconds()/sd.Seconds(), sy.Seconds()/sd.Seconds(), float64(seedRSS)/(1<<20), float64(cpRSS)/(1<<20))
		if before != "" {
			bf := median(befores)
			fmt.Printf(" %s (%.0f MiB/s) | %.2f | %.2f | %.1f MiB |", bf.Round(time.Millisecond), mibps(size, bf), sum.Seconds()/bf.Seconds(), cp.Seconds()/bf.Seconds(), float64(beforeRSS)/(1<<20))
		}
		fmt.Println()
		b.goals.Measured(goalSeedSpeed(mib), goals.Measurement{Value: sum.Seconds() / sd.Seconds(), Detail: fmt.Sprintf("seed %.2f s", sd.Seconds()),
			Baseline: fmt.Sprintf("`sha256sum` of the same archive: %.2f s", sum.Seconds())})
		b.goals.Measured(goalSeedRSS(mib), goals.Measurement{Value: float64(seedRSS) / (1 << 20), Detail: "the largest of its runs",
			Baseline: fmt.Sprintf("`cp` of the same archive: %.1f MiB", float64(cpRSS)/(1<<20))})
		l := fmt.Sprintf("%d MiB runs (s): sha256sum %s; cp %s; cp + sync %s; seed %s", size>>20, runs(sums), runs(cps), runs(syncs), runs(seeds))
		if before != "" {
			l += "; before " + runs(befores)
		}
		lines = append(lines, l)
		os.Remove(archive)
	}
	fmt.Println()
	for _, l := range lines {
		fmt.Printf("- %s\n", l)
	}
	fmt.Println()
	if !*seedNodes {
		return nil
	}
	return b.seedReady(ctx)
}

func mibps(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

// timed runs cmd, and says how long it took and its largest RSS (bytes): VmHWM from
// /proc/<pid>/status, read every 20 ms while it runs (the rusage of a child started
// with vfork counts the parent's RSS from before the exec).
func timed(cmd *exec.Cmd) (time.Duration, int64, error) {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	done := make(chan struct{})
	hwm := make(chan int64, 1)
	go func() {
		var most int64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			most = max(most, vmHWM(cmd.Process.Pid))
			select {
			case <-done:
				hwm <- most
				return
			case <-tick.C:
			}
		}
	}()
	err := cmd.Wait()
	took := time.Since(start)
	close(done)
	rss := <-hwm
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w\n%s", cmd, err, out.String())
	}
	return took, rss, nil
}

// vmHWM is pid's peak RSS (bytes), 0 when it cannot be read.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// writeSeedArchive writes an OCI layout tar of one image of about size bytes (layers
// of seedLayer random bytes each), streaming: each layer's bytes come from a seeded
// generator, read once for the digest and again into the tar. It says the tar's size.
func writeSeedArchive(file string, size int64) (int64, error) {
	n := max(int((size+seedLayer-1)/seedLayer), 1)
	type desc struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	}
	var layers []desc
	var diffIDs []string
	for i := range n {
		h := sha256.New()
		if _, err := io.Copy(h, layerBytes(i)); err != nil {
			return 0, err
		}
		d := "sha256:" + hex.EncodeToString(h.Sum(nil))
		layers = append(layers, desc{"application/vnd.oci.image.layer.v1.tar", d, seedLayer})
		diffIDs = append(diffIDs, d)
	}
	config, _ := json.Marshal(map[string]any{"architecture": "amd64", "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs}})
	configDesc := desc{"application/vnd.oci.image.config.v1+json", digestOf(config), int64(len(config))}
	manifest, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": configDesc, "layers": layers})
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []map[string]any{{
		"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digestOf(manifest), "size": len(manifest),
		"annotations": map[string]string{"org.opencontainers.image.ref.name": "bench.example.invalid/release:v1"}}}})

	f, err := os.Create(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	add := func(name string, n int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: n, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	blob := func(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }
	for _, x := range []struct {
		name string
		data []byte
	}{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", index}, {blob(digestOf(manifest)), manifest}, {blob(configDesc.Digest), config}} {
		if err := add(x.name, int64(len(x.data)), strings.NewReader(string(x.data))); err != nil {
			return 0, err
		}
	}
	for i, l := range layers {
		if err := add(blob(l.Digest), seedLayer, layerBytes(i)); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), f.Sync()
}

// layerBytes are layer i's seedLayer bytes, the same at each read.
func layerBytes(i int) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), 1}), seedLayer)
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// seedReadyHost is the images' host in the seeded rounds: it does not resolve.
const seedReadyHost = "seeded.example.invalid"

// seedReady measures 3 CRI-O nodes with [peers] on pre-loading the first images of
// the bench set: from the registry on loopback (the peers section's round), and from
// one seed (an OCI archive of the same images under a host that does not resolve,
// seeded on the first node before the set comes; no registry).
func (b *bench) seedReady(ctx context.Context) error {
	const nodes = 3
	imgs := b.imgs[:min(*peerImages, len(b.imgs))]
	dir := filepath.Join(b.dir, "seed-ready")
	archive, seededRefs, err := b.seedArchiveOf(ctx, imgs, dir)
	if err != nil {
		return err
	}
	link, err := env.StartLink(b.reg.Host, 0, 0)
	if err != nil {
		return err
	}
	defer link.Close()
	var regRefs []string
	for _, img := range imgs {
		regRefs = append(regRefs, strings.Replace(img.Ref(), b.reg.Host, link.Addr, 1))
	}
	ca, err := testcerts.NewCA(b.dir, "seed-ready-ca")
	if err != nil {
		return err
	}
	var fromReg, fromSeed, seeding []time.Duration
	for r := range *reps {
		took, err := b.peerRound(ctx, link, regRefs, nodes, 2, ca, fmt.Sprintf("seed-ready-reg-%d", r))
		if err != nil {
			return fmt.Errorf("from the registry: %w", err)
		}
		fromReg = append(fromReg, took)
		seedTook, took, err := b.seedRound(ctx, archive, seededRefs, nodes, ca, fmt.Sprintf("seed-ready-seed-%d", r))
		if err != nil {
			return fmt.Errorf("from one seed: %w", err)
		}
		fromSeed, seeding = append(fromSeed, took), append(seeding, seedTook)
		fmt.Fprintf(os.Stderr, "  seed-ready %d: from the registry %s, from one seed %s (seeding %s)\n", r, fromReg[r].Round(time.Millisecond), took.Round(time.Millisecond), seedTook.Round(time.Millisecond))
	}
	fi, _ := os.Stat(archive)
	fmt.Printf("## Seeding: %d CRI-O nodes ([peers] on) Ready from one seed against from a registry on loopback\n\n", nodes)
	fmt.Printf("The first %d images of the bench set (%.1f MiB archive). From the registry: the registry on loopback, every node pulling through its mirror and peers. From one seed: no registry, the images under %s (does not resolve), the archive seeded on one node with `imagepinctl seed` before the set comes; the others read it from their peers. Time from the set written on every node until every node is Ready. %d repetitions; medians.\n\n",
		len(imgs), float64(fi.Size())/(1<<20), seedReadyHost, *reps)
	fmt.Printf("| source | until %d nodes Ready | runs (s) | ÷ from the registry |\n|---|---|---|---|\n", nodes)
	reg := median(fromReg)
	fmt.Printf("| registry on loopback | %.2f s | %s | 1.00 |\n", reg.Seconds(), runs(fromReg))
	fmt.Printf("| one seed (no registry) | %.2f s | %s | **%.2f** |\n", median(fromSeed).Seconds(), runs(fromSeed), median(fromSeed).Seconds()/reg.Seconds())
	fmt.Printf("\nSeeding the archive on the one node took %.2f s (median) before that.\n\n", median(seeding).Seconds())
	return nil
}

// seedArchiveOf writes the images as an OCI archive, named under seedReadyHost, and
// says their references there.
func (b *bench) seedArchiveOf(ctx context.Context, imgs []env.Image, dir string) (string, []string, error) {
	layout := filepath.Join(dir, "layout")
	p, err := ggcrlayout.Write(layout, empty.Index)
	if err != nil {
		return "", nil, err
	}
	var refs []string
	for _, img := range imgs {
		ref, err := name.NewDigest(img.Ref(), name.Insecure)
		if err != nil {
			return "", nil, err
		}
		im, err := remote.Image(ref, remote.WithContext(ctx))
		if err != nil {
			return "", nil, err
		}
		repo := strings.Replace(img.Repo, b.reg.Host, seedReadyHost, 1)
		if err := p.AppendImage(im, ggcrlayout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": repo + ":latest"})); err != nil {
			return "", nil, err
		}
		refs = append(refs, repo+"@"+img.Digest)
	}
	archive := filepath.Join(dir, "set.tar")
	f, err := os.Create(archive)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(layout)); err != nil {
		return "", nil, err
	}
	if err := tw.Close(); err != nil {
		return "", nil, err
	}
	return archive, refs, os.RemoveAll(layout)
}

// seedRound starts n fresh CRI-O nodes with no registry and [peers] on, seeds archive
// on the first, then writes the set on every node: it says how long the seed took, and
// the time from the set until the last node was Ready.
func (b *bench) seedRound(ctx context.Context, archive string, refs []string, n int, ca *testcerts.CA, name string) (time.Duration, time.Duration, error) {
	port, err := env.FreePort()
	if err != nil {
		return 0, 0, err
	}
	var addrs []string
	for i := range n {
		addrs = append(addrs, fmt.Sprintf("127.0.0.%d:%d", 2+i, port))
	}
	var nodes []*node
	var daemons []*daemon
	defer func() {
		for _, d := range daemons {
			d.stop()
		}
		for _, c := range nodes {
			c.cleanup()
		}
	}()
	var cfg0 string
	for i := range n {
		dir := filepath.Join(b.dir, name, fmt.Sprint(i))
		c, err := env.NewCRIO(dir, env.CRIOOptions{})
		if err != nil {
			return 0, 0, err
		}
		if err := c.Start(ctx); err != nil {
			return 0, 0, err
		}
		nd := &node{runtime: "cri-o", socket: c.Socket, crio: c}
		nodes = append(nodes, nd)
		who := fmt.Sprintf("node-%d", i)
		serving, err := ca.NodeServing(dir, who, net.ParseIP(fmt.Sprintf("127.0.0.%d", 2+i)))
		if err != nil {
			return 0, 0, err
		}
		client, err := ca.Node(dir, who)
		if err != nil {
			return 0, 0, err
		}
		mport, err := env.FreePort()
		if err != nil {
			return 0, 0, err
		}
		extra := fmt.Sprintf("[peers]\nenabled = true\nmirror_address = \"127.0.0.1:%d\"\naddress = %q\nnodes = [\"%s\"]\ncert = %q\nca = %q\nclient_cert = %q\nclient_ca = %q\nserve_mib_per_second = 0\n",
			mport, addrs[i], strings.Join(addrs, `", "`), serving, ca.File, client, ca.File)
		exe := filepath.Join(dir, "imagepind")
		if err := copyFile(filepath.Join(*binDir, "imagepind"), exe); err != nil {
			return 0, 0, err
		}
		nd.exe = exe
		d, err := b.startDaemon(nd, filepath.Join(name, fmt.Sprint(i), "d"), 0, "2m", extra)
		if err != nil {
			return 0, 0, err
		}
		daemons = append(daemons, d)
		if i == 0 {
			cfg0 = filepath.Join(b.dir, name, "0", "d", "imagepind.toml")
		}
	}
	seedTook, _, err := timed(exec.CommandContext(ctx, filepath.Join(*binDir, "imagepinctl"), "seed", "--config", cfg0, archive))
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			daemons[i].writeSet("bench", refs)
			errs[i] = daemons[i].waitReady("bench")
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return 0, 0, err
		}
	}
	return seedTook, took, nil
}
