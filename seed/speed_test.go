package seed

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imagepin/imagepin/blobstore"
)

// speedLayer is the size of each layer of the speed test's archive (as test/bench's).
const speedLayer = 64 << 20

// TestSeedSpeed breaks down where a seed's time goes, on an OCI archive of
// IMAGEPIN_SEED_SPEED_MIB MiB (64 MiB layers of random bytes) in TMPDIR: reading,
// hashing, writing and syncing alone and together, against copy_file_range (what cp
// does), then the seed itself (with a CPU profile to IMAGEPIN_SEED_SPEED_PROFILE, when
// set). Skipped unless IMAGEPIN_SEED_SPEED_MIB is set: it writes gigabytes.
func TestSeedSpeed(t *testing.T) {
	mib, _ := strconv.Atoi(os.Getenv("IMAGEPIN_SEED_SPEED_MIB"))
	if mib <= 0 {
		t.Skip("IMAGEPIN_SEED_SPEED_MIB not set")
	}
	if keep := os.Getenv("IMAGEPIN_SEED_SPEED_ARCHIVE"); keep != "" {
		writeSpeedArchive(t, keep, int64(mib)<<20) // only the archive, for the real command
		return
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "media.tar")
	size, layers := writeSpeedArchive(t, archive, int64(mib)<<20)
	mibps := func(d time.Duration) string {
		return fmt.Sprintf("%8s %6.0f MiB/s", d.Round(time.Millisecond), float64(size)/(1<<20)/d.Seconds())
	}
	m, err := openMedia(archive)
	must(t, err)
	defer m.Close()
	type span struct{ off, n int64 }
	var spans []span
	for _, l := range layers {
		e := m.entries["blobs/sha256/"+l]
		spans = append(spans, span{e.off, e.size})
	}
	src := m.tars[0]
	out := filepath.Join(dir, "out")
	// stage reads every layer through fn (a fresh file per layer under out), in
	// `workers` goroutines, then syncs as told.
	stage := func(name string, bufSize, workers int, write, hash, syncEach, syncEnd bool, kick ...int64) {
		must(t, os.MkdirAll(out, 0o755))
		start := time.Now()
		next := make(chan int, len(spans))
		for i := range spans {
			next <- i
		}
		close(next)
		errs := make(chan error, workers)
		var files []*os.File
		fileCh := make(chan *os.File, len(spans))
		for range workers {
			go func() {
				buf := make([]byte, bufSize)
				for i := range next {
					h := sha256.New()
					var f *os.File
					if write {
						var err error
						f, err = os.Create(filepath.Join(out, strconv.Itoa(i)))
						if err != nil {
							errs <- err
							return
						}
					}
					for off := int64(0); off < spans[i].n; {
						n, err := src.ReadAt(buf[:min(int64(bufSize), spans[i].n-off)], spans[i].off+off)
						if err != nil && n == 0 {
							errs <- err
							return
						}
						if hash {
							h.Write(buf[:n])
						}
						if f != nil {
							if _, err := f.Write(buf[:n]); err != nil {
								errs <- err
								return
							}
							if len(kick) > 0 && (off+int64(n))%kick[0] == 0 {
								_ = unix.SyncFileRange(int(f.Fd()), off+int64(n)-kick[0], kick[0], unix.SYNC_FILE_RANGE_WRITE)
							}
						}
						off += int64(n)
					}
					if f != nil {
						if syncEach {
							if err := f.Sync(); err != nil {
								errs <- err
								return
							}
						}
						fileCh <- f
					}
				}
				errs <- nil
			}()
		}
		for range workers {
			must(t, <-errs)
		}
		close(fileCh)
		for f := range fileCh {
			files = append(files, f)
		}
		if syncEnd {
			must(t, unix.Syncfs(int(files[0].Fd())))
		}
		took := time.Since(start)
		for _, f := range files {
			f.Close()
		}
		must(t, os.RemoveAll(out))
		t.Logf("%-44s %s", name, mibps(took))
	}
	cfr := func(name string, sync bool) {
		start := time.Now()
		dst, err := os.Create(filepath.Join(dir, "copy"))
		must(t, err)
		s, err := os.Open(archive)
		must(t, err)
		_, err = io.Copy(dst, s) // copy_file_range, as cp
		must(t, err)
		if sync {
			must(t, dst.Sync())
		}
		took := time.Since(start)
		s.Close()
		dst.Close()
		os.Remove(filepath.Join(dir, "copy"))
		t.Logf("%-44s %s", name, mibps(took))
	}
	syncAll := func() { unix.Sync() }
	if os.Getenv("IMAGEPIN_SEED_SPEED_STAGES") != "0" {
		syncAll()
		cfr("copy_file_range (cp)", false)
		syncAll()
		cfr("copy_file_range + fsync (cp + sync)", true)
		syncAll()
		for _, buf := range []int{256 << 10, 1 << 20, 4 << 20} {
			stage(fmt.Sprintf("read, %d KiB", buf>>10), buf, 1, false, false, false, false)
		}
		stage("read+sha256, 256 KiB, 1 worker", 256<<10, 1, false, true, false, false)
		stage("read+sha256, 256 KiB, 2 workers", 256<<10, 2, false, true, false, false)
		for _, buf := range []int{256 << 10, 1 << 20, 4 << 20} {
			syncAll()
			stage(fmt.Sprintf("read+write, %d KiB, 1 worker", buf>>10), buf, 1, true, false, false, false)
		}
		syncAll()
		stage("read+write+sha256, 256 KiB, 1 worker", 256<<10, 1, true, true, false, false)
		syncAll()
		stage("read+write+sha256, 256 KiB, 2 workers", 256<<10, 2, true, true, false, false)
		syncAll()
		stage("read+write+sha256, 1 MiB, 2 workers", 1<<20, 2, true, true, false, false)
		syncAll()
		stage("r+w+sha256+fsync each, 256 KiB, 2 workers", 256<<10, 2, true, true, true, false)
		syncAll()
		stage("r+w+sha256+syncfs at end, 256 KiB, 2 w", 256<<10, 2, true, true, false, true)
		syncAll()
		stage("r+w+sha256+fsync each, 1 MiB, 2 workers", 1<<20, 2, true, true, true, false)
		syncAll()
		stage("r+w+sha256+syncfs at end, 1 MiB, 2 w", 1<<20, 2, true, true, false, true)
		for _, k := range []int64{1 << 20, 4 << 20, 16 << 20} {
			syncAll()
			stage(fmt.Sprintf("r+w+sha256+kick %d MiB+fsync each, 256K, 2w", k>>20), 256<<10, 2, true, true, true, false, k)
		}
		syncAll()
		stage("r+w+sha256+kick 4 MiB+syncfs end, 256K, 2w", 256<<10, 2, true, true, false, true, 4<<20)

	}
	// The seed itself, in each variant (workers:writeback MiB; writeback 0: none, the
	// commit's fsync writes the whole blob), taking turns; the profile is of the last
	// run.
	type variant struct {
		workers int
		step    int64
	}
	variants := []variant{{2, 0}, {2, 1 << 20}, {2, 4 << 20}, {2, 16 << 20}, {4, 4 << 20}}
	if v := os.Getenv("IMAGEPIN_SEED_SPEED_VARIANTS"); v != "" {
		variants = nil
		for _, f := range strings.Split(v, ",") {
			w, mb, _ := strings.Cut(f, ":")
			wn, err := strconv.Atoi(w)
			must(t, err)
			n, err := strconv.Atoi(mb)
			must(t, err)
			variants = append(variants, variant{wn, int64(n) << 20})
		}
	}
	reps, _ := strconv.Atoi(os.Getenv("IMAGEPIN_SEED_SPEED_REPS"))
	reps = max(reps, 1)
	defer func(w int, e int64) { copyWorkers, writebackEvery = w, e }(copyWorkers, writebackEvery)
	took := map[variant][]time.Duration{}
	name := func(v variant) string {
		return fmt.Sprintf("Seed, %d workers, writeback every %d MiB", v.workers, v.step>>20)
	}
	for r := range reps {
		for i, v := range variants {
			copyWorkers, writebackEvery = v.workers, v.step
			syncAll()
			storeDir, state := filepath.Join(dir, "store"), filepath.Join(dir, "state")
			st, err := blobstore.Open(storeDir)
			must(t, err)
			s := New(Config{Dir: state, StoreDir: storeDir}, Deps{Store: st})
			prof := os.Getenv("IMAGEPIN_SEED_SPEED_PROFILE")
			if prof != "" && r == reps-1 && i == len(variants)-1 {
				f, err := os.Create(prof)
				must(t, err)
				must(t, pprof.StartCPUProfile(f))
			}
			start := time.Now()
			sum, err := s.Seed(context.Background(), archive)
			d := time.Since(start)
			pprof.StopCPUProfile()
			must(t, err)
			if sum.Written < size-(1<<20) {
				t.Fatalf("seeded %d of %d bytes", sum.Written, size)
			}
			took[v] = append(took[v], d)
			t.Logf("%-52s %s", name(v), mibps(d))
			must(t, os.RemoveAll(storeDir))
			must(t, os.RemoveAll(state))
		}
	}
	for _, v := range variants {
		ds := took[v]
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("median %-45s %s", name(v), mibps(ds[len(ds)/2]))
	}
}

// writeSpeedArchive writes an OCI layout tar of about size bytes and says its size
// and its layers' hex digests.
func writeSpeedArchive(t *testing.T, file string, size int64) (int64, []string) {
	t.Helper()
	n := max(int(size/speedLayer), 1)
	layer := func(i int) io.Reader {
		return io.LimitReader(rand.NewChaCha8([32]byte{byte(i), byte(i >> 8), 2}), speedLayer)
	}
	type desc struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	}
	var ls []desc
	var hexes []string
	for i := range n {
		h := sha256.New()
		_, err := io.Copy(h, layer(i))
		must(t, err)
		x := hex.EncodeToString(h.Sum(nil))
		hexes = append(hexes, x)
		ls = append(ls, desc{"application/vnd.oci.image.layer.v1.tar", "sha256:" + x, speedLayer})
	}
	sum := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	config := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	cd := desc{"application/vnd.oci.image.config.v1+json", sum(config), int64(len(config))}
	manifest, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": cd, "layers": ls})
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []map[string]any{{
		"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sum(manifest), "size": len(manifest),
		"annotations": map[string]string{"org.opencontainers.image.ref.name": "speed.example.invalid/app:v1"}}}})
	f, err := os.Create(file)
	must(t, err)
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	add := func(name string, n int64, r io.Reader) {
		must(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: n, Typeflag: tar.TypeReg}))
		_, err := io.Copy(tw, r)
		must(t, err)
	}
	blob := func(d string) string { return "blobs/sha256/" + d[len("sha256:"):] }
	add("oci-layout", 30, bytesReader(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", int64(len(index)), bytesReader(string(index)))
	add(blob(sum(manifest)), int64(len(manifest)), bytesReader(string(manifest)))
	add(blob(cd.Digest), cd.Size, bytesReader(string(config)))
	for i, l := range ls {
		add(blob(l.Digest), speedLayer, layer(i))
	}
	must(t, tw.Close())
	must(t, bw.Flush())
	must(t, f.Sync())
	fi, err := f.Stat()
	must(t, err)
	return fi.Size(), hexes
}

func bytesReader(s string) io.Reader { return &stringReader{s: s} }

type stringReader struct{ s string }

func (r *stringReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p, r.s)
	r.s = r.s[n:]
	return n, nil
}
