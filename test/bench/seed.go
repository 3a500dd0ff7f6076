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
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

var seedSizes = flag.String("seed-mib", "512,2048", "archive sizes for the seed section, MiB")

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
	fmt.Printf("## Seeding: `imagepinctl seed` of an OCI archive, against `cp` of the same archive\n\n")
	fmt.Printf("One image of %d MiB layers of random bytes in an OCI layout tar, on the same filesystem as the store and the copy (%s). ", seedLayer>>20, dir)
	fmt.Printf("`cp` copies the archive; `cp + sync` also flushes it to disk, as the store's commits do. Each run seeds into an empty store. %d repetitions; medians.\n\n", *reps)
	fmt.Printf("| archive | cp | cp + sync | imagepinctl seed | seed ÷ cp throughput | seed ÷ (cp + sync) | seed max RSS | cp max RSS |\n|---|---|---|---|---|---|---|---|\n")
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
		var cps, syncs, seeds []time.Duration
		var seedRSS, cpRSS int64
		for r := range *reps {
			dst := filepath.Join(dir, "copy.tar")
			took, rss, err := timed(exec.CommandContext(ctx, "cp", archive, dst))
			if err != nil {
				return err
			}
			cps = append(cps, took)
			cpRSS = max(cpRSS, rss)
			os.Remove(dst)
			took, _, err = timed(exec.CommandContext(ctx, "sh", "-c", `cp "$1" "$2" && sync -f "$2"`, "sh", archive, dst))
			if err != nil {
				return err
			}
			syncs = append(syncs, took)
			os.Remove(dst)

			state := filepath.Join(dir, fmt.Sprintf("state-%d-%d", mib, r))
			cfg := filepath.Join(dir, "imagepind.toml")
			if err := os.WriteFile(cfg, fmt.Appendf(nil, "state_dir = %q\n[peers]\nenabled = true\n", state), 0o644); err != nil {
				return err
			}
			cmd := exec.CommandContext(ctx, ctl, "seed", "--config", cfg, archive)
			took, rss, err = timed(cmd)
			if err != nil {
				return fmt.Errorf("imagepinctl seed %s: %w", archive, err)
			}
			seeds = append(seeds, took)
			seedRSS = max(seedRSS, rss)
			os.RemoveAll(state)
			fmt.Fprintf(os.Stderr, "  seed %d MiB: cp %s, cp+sync %s, seed %s (RSS %d MiB)\n", mib, cps[r].Round(time.Millisecond), syncs[r].Round(time.Millisecond), took.Round(time.Millisecond), rss>>20)
		}
		cp, sy, sd := median(cps), median(syncs), median(seeds)
		fmt.Printf("| %d MiB | %s (%.0f MiB/s) | %s (%.0f MiB/s) | %s (%.0f MiB/s) | **%.2f** | %.2f | **%.1f MiB** | %.1f MiB |\n", size>>20,
			cp.Round(time.Millisecond), mibps(size, cp), sy.Round(time.Millisecond), mibps(size, sy), sd.Round(time.Millisecond), mibps(size, sd),
			cp.Seconds()/sd.Seconds(), sy.Seconds()/sd.Seconds(), float64(seedRSS)/(1<<20), float64(cpRSS)/(1<<20))
		os.Remove(archive)
	}
	fmt.Println()
	return nil
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
	return io.LimitReader(&randReader{r: rand.New(rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), 1}))}, seedLayer)
}

type randReader struct{ r *rand.Rand }

func (r *randReader) Read(p []byte) (int, error) {
	for i := 0; i < len(p); i += 8 {
		v := r.r.Uint64()
		for j := 0; j < 8 && i+j < len(p); j++ {
			p[i+j] = byte(v >> (8 * j))
		}
	}
	return len(p), nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
