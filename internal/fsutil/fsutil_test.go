package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadRegularRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRegular(fifo, 1<<20); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("FIFO: got %v, want ErrNotRegular", err)
	}
	zero := filepath.Join(dir, "zero.yaml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRegular(zero, 1<<20); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("/dev/zero: got %v, want ErrNotRegular", err)
	}
	if _, err := ReadRegular(dir, 1<<20); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("directory: got %v, want ErrNotRegular", err)
	}
}

func TestReadRegularLimit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(p, make([]byte, 101), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRegular(p, 100); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if b, err := ReadRegular(p, 101); err != nil || len(b) != 101 {
		t.Fatalf("at the limit: %d bytes, %v", len(b), err)
	}
}

func TestWriteAtomicTempElsewhere(t *testing.T) {
	root := t.TempDir()
	dropins := filepath.Join(root, "crio.conf.d")
	if err := os.Mkdir(dropins, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dropins, "zz.conf")
	if err := WriteAtomic(target, root, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteAtomic(target, root, []byte("b"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(target)
	if string(got) != "b" {
		t.Fatalf("content %q", got)
	}
	for _, d := range []string{root, dropins} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.Name() != "crio.conf.d" && e.Name() != "zz.conf" {
				t.Fatalf("left behind %s in %s", e.Name(), d)
			}
		}
	}
	fi, _ := os.Stat(target)
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", fi.Mode())
	}
}

// A file name of NAME_MAX (255) bytes can be written: the temp name does not grow past it.
func TestWriteAtomicLongName(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, strings.Repeat("x", 250)+".json")
	if err := WriteAtomic(p, "", []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "{}" {
		t.Fatalf("read back: %q %v", b, err)
	}
}

func TestTryLockIsExclusiveUntilReleased(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := TryLock(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TryLock(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("a second lock while held: %v, want ErrLocked", err)
	}
	unlock()
	again, err := TryLock(path)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	again()
}
