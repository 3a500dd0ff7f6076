// Package reload keeps what a loader makes of files, made again only when one of the
// files changed: the same file (a symlink pointed elsewhere), size and modification
// time. The node's certificates and CA bundles are read so at every TLS handshake: a
// rotated file is taken at the next one, an unchanged one costs two stats, not a parse.
package reload

import (
	"os"
	"sync"
)

// Files is T as load makes it from files.
type Files[T any] struct {
	files []string
	load  func() (T, error)

	mu   sync.Mutex
	seen []os.FileInfo // the files as they were at the last load (nil: load again)
	last T
	ok   bool // last is a good load
}

// New is load's T of files, loaded at each Get after one of them changed.
func New[T any](load func() (T, error), files ...string) *Files[T] {
	return &Files[T]{files: files, load: load}
}

// Get is T as the files are now. When they changed and no longer load (a file being
// replaced by hand), the last good T stays in use and the files are not loaded again
// until they change once more; with no good T yet, the load's error.
func (f *Files[T]) Get() (T, error) {
	now := make([]os.FileInfo, len(f.files))
	for i, name := range f.files {
		fi, err := os.Stat(name)
		if err != nil {
			now = nil
			break
		}
		now[i] = fi
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ok && now != nil && f.unchanged(now) {
		return f.last, nil
	}
	v, err := f.load()
	switch {
	case err == nil:
		f.last, f.ok = v, true
	case !f.ok:
		return v, err
	}
	f.seen = now
	return f.last, nil
}

func (f *Files[T]) unchanged(now []os.FileInfo) bool {
	if len(f.seen) != len(now) {
		return false
	}
	for i, a := range f.seen {
		b := now[i]
		if !os.SameFile(a, b) || a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
			return false
		}
	}
	return true
}
