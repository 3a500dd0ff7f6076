package seed

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"golang.org/x/sys/unix"
)

// A seed has the disk write a blob while it copies the rest of it: at every progress
// report, the ingests hold no more dirty pages than each writer's last writebackEvery
// bytes and a buffer (without it, a 16 MiB layer is all dirty until its commit's
// fsync).
func TestSeedWritesBehind(t *testing.T) {
	defer func(old int64) { writebackEvery = old }(writebackEvery)
	writebackEvery = 1 << 20
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := ggcrlayout.Write(dir, empty.Index)
	must(t, err)
	img, err := random.Image(16<<20, 1, rnd(7))
	must(t, err)
	must(t, p.AppendImage(img))
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is on tmpfs (or statfs failed: %v): no writeback to see", dir, err)
	}
	clock := &stepClock{}
	var e *env
	var most, reports uint64
	e = newEnv(t, Deps{Now: clock.now, Progress: func(Progress) {
		reports++
		files, _ := filepath.Glob(filepath.Join(e.storeDir, "ingest", "*", "data"))
		var dirty uint64
		for _, name := range files {
			f, err := os.Open(name)
			if err != nil {
				continue // committed meanwhile
			}
			var st unix.Cachestat_t
			if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &st, 0); err != nil {
				f.Close()
				t.Skipf("cachestat(2): %v", err)
			}
			f.Close()
			dirty += st.Dirty
		}
		most = max(most, dirty)
	}})
	if _, err := e.seeder.Seed(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	page := uint64(os.Getpagesize())
	limit := uint64(copyWorkers) * uint64(writebackEvery+copyBuf) / page
	if reports < 16 || most > limit {
		t.Fatalf("at most %d pages dirty in the ingests (%d reports), want at most %d", most, reports, limit)
	}
	t.Logf("at most %d pages dirty in the ingests (%d reports; limit %d)", most, reports, limit)
}
