package seedwatch

import (
	"archive/tar"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/seed"
)

// counting is the real seeder, its calls counted.
type counting struct {
	*seed.Seeder
	seeds, forgets atomic.Int32
	written        atomic.Int64
}

func (c *counting) Seed(ctx context.Context, path string) (*seed.Summary, error) {
	c.seeds.Add(1)
	sum, err := c.Seeder.Seed(ctx, path)
	if err == nil {
		c.written.Add(sum.Written)
	}
	return sum, err
}

func (c *counting) Forget(ctx context.Context, path string, pinned []string, except string) ([]*seed.Removed, error) {
	c.forgets.Add(1)
	return c.Seeder.Forget(ctx, path, pinned, except)
}

type env struct {
	dir, seeds string
	store      *blobstore.Store
	seeder     *counting
	w          *Watcher
	now        time.Time
	writing    atomic.Bool
}

const settle = 10 * time.Second

func newEnv(t *testing.T) *env {
	t.Helper()
	root := t.TempDir()
	e := &env{dir: filepath.Join(root, "seed.d"), seeds: seed.Dir(filepath.Join(root, "state")), now: time.Unix(1_800_000_000, 0)}
	if err := os.Mkdir(e.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := blobstore.Open(filepath.Join(root, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	e.seeder = &counting{Seeder: seed.New(seed.Config{Dir: e.seeds, StoreDir: filepath.Join(root, "blobs")}, seed.Deps{Store: st})}
	log := logrus.New()
	log.SetLevel(logrus.DebugLevel)
	e.w = New(Config{Dir: e.dir, SeedsDir: e.seeds, Settle: settle}, Deps{Seeder: e.seeder, Log: log,
		Now: func() time.Time { return e.now }, Writing: func(string) (bool, error) { return e.writing.Load(), nil }})
	return e
}

// scan scans at e.now, then moves the clock on by after.
func (e *env) scan(after time.Duration) time.Time {
	next := e.w.Scan(context.Background())
	e.now = e.now.Add(after)
	return next
}

// oci writes an OCI layout of one random image named name at dir.
func oci(t *testing.T, dir, name string) {
	t.Helper()
	img, err := random.Image(32<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ggcrlayout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, ggcrlayout.WithAnnotations(map[string]string{ocispec.AnnotationRefName: name})); err != nil {
		t.Fatal(err)
	}
}

func (e *env) records(t *testing.T) []*seed.Record {
	t.Helper()
	recs, err := seed.Records(e.seeds)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func (e *env) blobs(t *testing.T) int {
	t.Helper()
	n := 0
	if err := e.store.Walk(context.Background(), func(_ digest.Digest, _ int64) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// A medium is seeded once it stayed unchanged for the settle time with nobody
// writing it, once; taken away, its seed and blobs go.
func TestAMediumSettlesThenIsSeededAndGoesWhenTakenAway(t *testing.T) {
	e := newEnv(t)
	med := filepath.Join(e.dir, "app")
	oci(t, med, "quay.io/ns/app:v1")
	if next := e.scan(settle / 2); !next.Equal(e.now.Add(settle / 2)) {
		t.Fatalf("a new medium: next scan at %s, want when it has settled", next)
	}
	if n := e.seeder.seeds.Load(); n != 0 {
		t.Fatal("seeded before it settled")
	}
	// It changes: settling starts again.
	if err := os.WriteFile(filepath.Join(med, "extra"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.scan(settle / 2)
	e.scan(settle / 2)
	if n := e.seeder.seeds.Load(); n != 0 {
		t.Fatal("seeded though it changed half a settle ago")
	}
	// Settled, but a process writes it.
	e.writing.Store(true)
	e.scan(settle)
	if n := e.seeder.seeds.Load(); n != 0 {
		t.Fatal("seeded while a process writes it")
	}
	e.writing.Store(false)
	e.scan(settle)
	if n := e.seeder.seeds.Load(); n != 1 || len(e.records(t)) != 1 {
		t.Fatalf("settled and unwritten: %d seeds, %d records", n, len(e.records(t)))
	}
	first := e.seeder.written.Load()
	e.scan(time.Hour)
	e.scan(time.Hour)
	if n := e.seeder.seeds.Load(); n != 1 {
		t.Fatalf("seeded %d times, want once", n)
	}
	// A watcher started again (imagepind restarted) reads it once more, and writes
	// nothing.
	e.w = New(e.w.cfg, e.w.deps)
	e.scan(settle)
	e.scan(settle)
	e.scan(settle)
	if n := e.seeder.seeds.Load(); n != 2 || e.seeder.written.Load() != first {
		t.Fatalf("after a restart: seeded %d times (want 2), %d bytes written in all (want the first run's %d)", n, e.seeder.written.Load(), first)
	}
	if e.blobs(t) == 0 {
		t.Fatal("nothing in the store")
	}
	// Taken away: the record and the blobs go.
	if err := os.RemoveAll(med); err != nil {
		t.Fatal(err)
	}
	e.scan(time.Second)
	if len(e.records(t)) != 0 || e.blobs(t) != 0 {
		t.Fatalf("taken away: %d records, %d blobs left", len(e.records(t)), e.blobs(t))
	}
}

// A medium that is refused (a truncated tar) is tried again only when it changes;
// hidden entries and copies in progress are not media; an empty directory (a mount
// point, nothing mounted) is not seeded and counts as taken away.
func TestRefusedPartialAndEmpty(t *testing.T) {
	e := newEnv(t)
	good := filepath.Join(t.TempDir(), "good")
	oci(t, good, "quay.io/ns/app:v1")
	tarFile := filepath.Join(e.dir, "app.tar")
	writeTar(t, good, tarFile)
	full, err := os.ReadFile(tarFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tarFile, full[:len(full)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{".app.tar.Xy12ab", "app.tar.part", "other.tmp"} {
		if err := os.WriteFile(filepath.Join(e.dir, name), full[:100], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(e.dir, "usb")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	e.scan(settle)
	e.scan(settle)
	e.scan(settle)
	e.scan(time.Hour)
	if n := e.seeder.seeds.Load(); n != 1 || len(e.records(t)) != 0 || e.blobs(t) != 0 {
		t.Fatalf("a truncated tar and partial copies: %d seeds tried (want the tar once), %d records, %d blobs", n, len(e.records(t)), e.blobs(t))
	}
	// The copy completes: seeded.
	if err := os.WriteFile(tarFile, full, 0o644); err != nil {
		t.Fatal(err)
	}
	e.scan(settle)
	e.scan(settle)
	if recs := e.records(t); len(recs) != 1 || recs[0].Media[0].Path != tarFile {
		t.Fatalf("the complete tar: %d records", len(recs))
	}
	// A medium mounted on the empty directory (here: copied in), then unmounted.
	other := filepath.Join(t.TempDir(), "other")
	oci(t, other, "quay.io/ns/other:v1")
	if err := os.RemoveAll(mnt); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(mnt, os.DirFS(other)); err != nil {
		t.Fatal(err)
	}
	e.scan(settle)
	e.scan(settle)
	if recs := e.records(t); len(recs) != 2 {
		t.Fatalf("mounted: %d records, want 2", len(recs))
	}
	if err := os.RemoveAll(mnt); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	e.scan(time.Second)
	if recs := e.records(t); len(recs) != 1 || recs[0].Media[0].Path != tarFile {
		t.Fatalf("unmounted: %d records, want the tar's", len(recs))
	}
}

// The next release's archive under the same name: seeded, and the seed of the one it
// replaced goes.
func TestAMediumReplacedAtItsPath(t *testing.T) {
	e := newEnv(t)
	med := filepath.Join(e.dir, "release")
	oci(t, med, "quay.io/ns/app:v1")
	e.scan(settle)
	e.scan(settle)
	first := e.records(t)
	if len(first) != 1 {
		t.Fatalf("%d records", len(first))
	}
	if err := os.RemoveAll(med); err != nil {
		t.Fatal(err)
	}
	oci(t, med, "quay.io/ns/app:v2")
	// Copied keeping its files' times (rsync -a), older than the first seed.
	past := time.Unix(1_000_000_000, 0)
	filepath.Walk(med, func(p string, _ os.FileInfo, _ error) error { return os.Chtimes(p, past, past) })
	e.scan(settle)
	e.scan(settle)
	recs := e.records(t)
	if len(recs) != 1 || recs[0].ID == first[0].ID || recs[0].Images[0].Tag != "v2" {
		t.Fatalf("after the replacement: %d records (%v)", len(recs), recs)
	}
}

// With imagepind's clock and the directory's real events: a medium copied in is
// seeded, and taken away, removed.
func TestRun(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "seed.d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	seeds := seed.Dir(filepath.Join(root, "state"))
	st, err := blobstore.Open(filepath.Join(root, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	w := New(Config{Dir: dir, SeedsDir: seeds, Settle: 300 * time.Millisecond, Rescan: time.Hour},
		Deps{Seeder: seed.New(seed.Config{Dir: seeds, StoreDir: filepath.Join(root, "blobs")}, seed.Deps{Store: st}), Log: logrus.New()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Copied in under a hidden name, then renamed: the usual way to drop a medium.
	tmp := filepath.Join(dir, ".app.partial")
	oci(t, tmp, "quay.io/ns/app:v1")
	if err := os.Rename(tmp, filepath.Join(dir, "app")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the medium seeded", func() bool { r, _ := seed.Records(seeds); return len(r) == 1 && r[0].Complete })
	if err := os.RemoveAll(filepath.Join(dir, "app")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "its seed removed", func() bool { r, _ := seed.Records(seeds); return len(r) == 0 })
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A file held open for writing by a process is seen; closed, it is not.
func TestWriting(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "copying.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if busy, err := writing(dir); err != nil || !busy {
		t.Fatalf("a file open for writing: %v %v", busy, err)
	}
	f.Close()
	r, err := os.Open(filepath.Join(dir, "copying.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if busy, err := writing(dir); err != nil || busy {
		t.Fatalf("open for reading only: %v %v", busy, err)
	}
}

// writeTar writes dir as a tar at file (names relative to dir), as tar -C dir -cf does.
func writeTar(t *testing.T, dir, file string) {
	t.Helper()
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// A medium that cannot be read for a scan (an I/O error, a stale share, a name too
// long, a file going while it is walked) keeps its seed and is shown as a fault; read
// again, it is seeded as before (nothing written) and the fault goes. Only a medium
// whose own entry is gone is forgotten.
func TestAMediumThatCannotBeReadKeepsItsSeed(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  func(med string) error
	}{
		{"EIO", func(med string) error { return &fs.PathError{Op: "lstat", Path: med, Err: syscall.EIO} }},
		{"ESTALE", func(med string) error { return &fs.PathError{Op: "lstat", Path: med, Err: syscall.ESTALE} }},
		{"ENAMETOOLONG", func(med string) error {
			return &fs.PathError{Op: "lstat", Path: med + "/blobs/" + strings.Repeat("x", 300), Err: syscall.ENAMETOOLONG}
		}},
		{"an entry going mid-walk", func(med string) error {
			return &fs.PathError{Op: "lstat", Path: med + "/blobs/sha256/0123", Err: syscall.ENOENT}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			med := filepath.Join(e.dir, "app")
			oci(t, med, "quay.io/ns/app:v1")
			e.scan(settle)
			e.scan(settle)
			if len(e.records(t)) != 1 {
				t.Fatal("not seeded")
			}
			blobs, forgets := e.blobs(t), e.seeder.forgets.Load()
			var fail atomic.Bool
			e.w.fingerprint = func(path string) (fingerprint, error) {
				if fail.Load() && path == med {
					return fingerprint{}, tc.err(med)
				}
				return fingerprintOf(path)
			}
			fail.Store(true)
			e.scan(settle)
			e.scan(time.Hour)
			if n := e.seeder.forgets.Load() - forgets; n != 0 || len(e.records(t)) != 1 || e.blobs(t) != blobs {
				t.Fatalf("unreadable for a scan: %d forgets, %d records, %d blobs (want 0, 1, %d)", n, len(e.records(t)), e.blobs(t), blobs)
			}
			mf, err := seed.ReadMediaFaults(e.seeds)
			if err != nil || mf == nil || len(mf.Media) != 1 || mf.Media[0].Path != med || !strings.Contains(mf.Media[0].Fault, "cannot be read") ||
				!strings.Contains(mf.Media[0].Fault, tc.err(med).(*fs.PathError).Err.Error()) {
				t.Fatalf("the media's faults: %+v, %v; want %s as unreadable", mf, err, med)
			}
			fail.Store(false)
			written := e.seeder.written.Load()
			e.scan(settle)
			if mf, _ := seed.ReadMediaFaults(e.seeds); mf == nil || len(mf.Media) != 0 {
				t.Fatalf("readable again: faults %+v, want none", mf)
			}
			if e.seeder.written.Load() != written || len(e.records(t)) != 1 {
				t.Fatal("readable again: written again")
			}
			// Gone for real: forgotten.
			if err := os.RemoveAll(med); err != nil {
				t.Fatal(err)
			}
			e.scan(time.Second)
			if len(e.records(t)) != 0 || e.blobs(t) != 0 {
				t.Fatalf("taken away: %d records, %d blobs left", len(e.records(t)), e.blobs(t))
			}
		})
	}
}

// fingerprintOf tells a medium whose own entry is gone (errGone) from one that cannot
// be read: a path too long for the system under it is not gone.
func TestFingerprintGoneOrUnreadable(t *testing.T) {
	dir := t.TempDir()
	if _, err := fingerprintOf(filepath.Join(dir, "nothing")); !errors.Is(err, errGone) {
		t.Fatalf("no such entry: %v, want errGone", err)
	}
	// A medium holding a path longer than PATH_MAX (made a directory at a time).
	med := filepath.Join(dir, "deep")
	if err := os.Mkdir(med, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(med, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("d", 250)
	for range 20 {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	t.Cleanup(func() { removeDeep(med, name) })
	_, err = fingerprintOf(med)
	if err == nil || errors.Is(err, errGone) || !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Fatalf("a path too long under the medium: %v, want ENAMETOOLONG and not errGone", err)
	}
}

// removeDeep removes the chain of directories name/name/… under dir, deepest first
// (os.RemoveAll cannot name them).
func removeDeep(dir, name string) {
	var fds []int
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	for err == nil {
		fds = append(fds, fd)
		fd, err = unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	}
	for i := len(fds) - 1; i >= 0; i-- {
		if i < len(fds)-1 {
			unix.Unlinkat(fds[i], name, unix.AT_REMOVEDIR)
		}
		unix.Close(fds[i])
	}
}

// scanWithin scans as scan does, failing the test (not hanging it) when a scan takes
// longer than a few seconds.
func (e *env) scanWithin(t *testing.T, after time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { e.w.Scan(context.Background()); close(done) }()
	select {
	case <-done:
		e.now = e.now.Add(after)
	case <-time.After(10 * time.Second):
		t.Fatal("a scan: no answer after 10s (blocked on a FIFO?)")
	}
}

// Hostile media in the directory (a truncated tar, a FIFO named like an oc-mirror
// archive, a layer whose bytes are not its digest) are refused, nothing of them stored,
// and shown, each naming its file, in the media's faults (the node's status, seed
// --list) until taken away: across scans and a restart of imagepind. The watcher never
// hangs on the FIFO.
func TestHostileMediaAreShownUntilTakenAway(t *testing.T) {
	e := newEnv(t)
	good := filepath.Join(t.TempDir(), "good")
	oci(t, good, "quay.io/ns/app:v1")
	truncated := filepath.Join(e.dir, "release.tar")
	writeTar(t, good, truncated)
	fi, err := os.Stat(truncated)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(truncated, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	fifoDir := filepath.Join(e.dir, "oc-mirror")
	if err := os.Mkdir(fifoDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(fifoDir, "mirror_000001.tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	badBlob := filepath.Join(e.dir, "bad-blob")
	oci(t, badBlob, "quay.io/ns/bad:v1")
	blobs, _ := filepath.Glob(filepath.Join(badBlob, "blobs", "sha256", "*"))
	var layer string
	for _, b := range blobs {
		if fi, _ := os.Stat(b); fi.Size() > 16<<10 {
			layer = b
			break
		}
	}
	data, err := os.ReadFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(layer, data, 0o644); err != nil {
		t.Fatal(err)
	}
	faults := func() map[string]string {
		t.Helper()
		mf, err := seed.ReadMediaFaults(e.seeds)
		if err != nil || mf == nil || mf.Directory != e.dir {
			t.Fatalf("the media's faults: %+v, %v", mf, err)
		}
		out := map[string]string{}
		for _, f := range mf.Media {
			out[f.Path] = f.Fault
		}
		return out
	}
	want := map[string]string{truncated: "truncated", fifoDir: "mirror_000001.tar: not a regular file (a FIFO)", badBlob: "unexpected commit digest"}
	check := func(when string) {
		t.Helper()
		got := faults()
		for path, what := range want {
			if !strings.Contains(got[path], "refused") || !strings.Contains(got[path], what) {
				t.Errorf("%s: the fault of %s: %q, want it refused with %q", when, path, got[path], what)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: faults of %d media, want %d: %v", when, len(got), len(want), got)
		}
		// The node's status shows them, naming each file.
		_, shown := seed.NewReport(e.seeds, e.dir).Status(nil)
		if len(shown) != len(want) {
			t.Errorf("%s: the node's status shows %q", when, shown)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	e.scanWithin(t, settle)
	e.scanWithin(t, settle)
	check("refused")
	if e.blobs(t) != 0 || len(e.records(t)) != 0 {
		t.Fatalf("stored %d blobs, %d records of hostile media", e.blobs(t), len(e.records(t)))
	}
	e.scanWithin(t, time.Hour)
	e.scanWithin(t, time.Hour)
	check("an hour on")
	// imagepind restarted: shown still, from its first scan.
	e.w = New(e.w.cfg, e.w.deps)
	e.scanWithin(t, settle)
	check("restarted, first scan")
	e.scanWithin(t, settle)
	check("restarted, refused again")
	// Taken away one by one: each fault goes with its medium.
	for _, p := range []string{truncated, fifoDir, badBlob} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
		delete(want, p)
		e.scanWithin(t, time.Second)
		check(filepath.Base(p) + " taken away")
	}
}
