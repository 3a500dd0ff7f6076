package watch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func waitTrigger(t *testing.T, w *Watcher, what string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(5 * time.Second):
		t.Fatalf("no trigger after %s", what)
	}
}

// testDebounce leaves room for a loaded CI machine (unit tier under -race, packages in
// parallel on 2 cores): a burst must coalesce even when its writes are tens of ms apart.
const testDebounce = 100 * time.Millisecond

func noTrigger(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case <-w.C():
		t.Fatal("unexpected trigger")
	case <-time.After(3 * testDebounce):
	}
}

func TestWatcherFollowsDirectoryLifecycle(t *testing.T) {
	root := t.TempDir()
	sets := filepath.Join(root, "sets.d")
	labels := filepath.Join(root, "labels.json")
	dropins := filepath.Join(root, "crio.conf.d")
	os.Mkdir(sets, 0o755)
	os.MkdirAll(filepath.Join(dropins, "sub"), 0o755)

	w := New(testDebounce, logrus.New(), Path{Name: sets}, Path{Name: labels}, Path{Name: dropins, Recursive: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	time.Sleep(50 * time.Millisecond)

	// The first change triggers at once, without waiting out the debounce.
	start := time.Now()
	os.WriteFile(filepath.Join(sets, "first.yaml"), nil, 0o644)
	waitTrigger(t, w, "a write after a quiet spell")
	if took := time.Since(start); took >= testDebounce {
		t.Errorf("the first change waited %s: the debounce is for what follows it", took)
	}
	// A lone change soon after a trigger (imagepind's own write of its drop-in, then
	// the set file an administrator saves) triggers at once too.
	os.WriteFile(filepath.Join(sets, "second.yaml"), nil, 0o644)
	waitTrigger(t, w, "a write after a quiet spell")
	start = time.Now()
	os.WriteFile(filepath.Join(sets, "third.yaml"), nil, 0o644)
	waitTrigger(t, w, "a second write soon after")
	if took := time.Since(start); took >= testDebounce {
		t.Errorf("a lone change after a trigger waited %s: only bursts are debounced", took)
	}
	noTrigger(t, w)

	// A burst of writes is one trigger soon, and at most one more once it is over.
	for i := 0; i < 5; i++ {
		os.WriteFile(filepath.Join(sets, "a.yaml"), []byte{byte(i)}, 0o644)
	}
	waitTrigger(t, w, "writes in the sets dir")
	select {
	case <-w.C():
	case <-time.After(3 * testDebounce):
	}
	noTrigger(t, w)

	os.WriteFile(labels, []byte("{}"), 0o644)
	waitTrigger(t, w, "labels file created")

	// Another file next to the labels file is none of our business.
	os.WriteFile(filepath.Join(root, "status.json"), []byte("{}"), 0o644)
	noTrigger(t, w)

	os.WriteFile(filepath.Join(dropins, "sub", "x.conf"), nil, 0o644)
	waitTrigger(t, w, "a file in a drop-in subdirectory")

	// The sets dir removed and re-created: still watched.
	os.RemoveAll(sets)
	waitTrigger(t, w, "sets dir removed")
	os.Mkdir(sets, 0o755)
	waitTrigger(t, w, "sets dir re-created")
	time.Sleep(50 * time.Millisecond)
	os.WriteFile(filepath.Join(sets, "b.yaml"), nil, 0o644)
	waitTrigger(t, w, "write in the re-created sets dir")

	// A ConfigMap-style swap: ..data symlink renamed over.
	os.Mkdir(filepath.Join(sets, "..2026_01"), 0o755)
	os.Symlink("..2026_01", filepath.Join(sets, "..data_tmp"))
	os.Rename(filepath.Join(sets, "..data_tmp"), filepath.Join(sets, "..data"))
	waitTrigger(t, w, "..data swap")
}

// A stream of changes that never goes quiet triggers at least every debounce, and a
// lone change (its create, write and rename) once.
func TestWatcherStreamTriggersEveryDebounce(t *testing.T) {
	sets := filepath.Join(t.TempDir(), "sets.d")
	os.Mkdir(sets, 0o755)
	w := New(testDebounce, logrus.New(), Path{Name: sets})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	time.Sleep(50 * time.Millisecond)

	// A set written the atomic way, as a sync tool does: one trigger.
	os.WriteFile(filepath.Join(sets, ".a.yaml.tmp"), []byte("x"), 0o644)
	os.Rename(filepath.Join(sets, ".a.yaml.tmp"), filepath.Join(sets, "a.yaml"))
	waitTrigger(t, w, "an atomic write")
	noTrigger(t, w)

	// Writes every 2 ms for 6 debounces: never quiet for the settle (10 ms here).
	stop := time.Now().Add(6 * testDebounce)
	triggers := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; time.Now().Before(stop); i++ {
			os.WriteFile(filepath.Join(sets, "b.yaml"), []byte{byte(i)}, 0o644)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	for {
		select {
		case <-w.C():
			triggers++
			continue
		case <-done:
		}
		break
	}
	if triggers < 3 {
		t.Fatalf("%d triggers during 6 debounces of writes, want one at least every debounce", triggers)
	}
}

// An empty path (a config key left empty) is not the working directory: before, it was
// cleaned to "." and a recursive one walked whatever directory imagepind ran in.
func TestEmptyPathsAreSkipped(t *testing.T) {
	w := New(time.Millisecond, logrus.New(), Path{Name: ""}, Path{Name: "", Recursive: true}, Path{Name: "/etc/x/"})
	if len(w.paths) != 1 || w.paths[0].Name != "/etc/x" {
		t.Fatalf("paths %+v", w.paths)
	}
}
