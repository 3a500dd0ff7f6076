package watch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"
)

// Path is one thing to watch.
type Path struct {
	Name      string
	Recursive bool
}

// Watcher sends on C once changes have been quiet for a short settle (25 ms at most),
// and at least every Debounce while they keep coming.
type Watcher struct {
	paths    []Path
	debounce time.Duration
	log      logrus.FieldLogger
	c        chan struct{}
}

// New returns a watcher; Run starts it. A path with an empty name (a config key left
// empty: no such file) is skipped, never taken for the working directory.
func New(debounce time.Duration, log logrus.FieldLogger, paths ...Path) *Watcher {
	var kept []Path
	for _, p := range paths {
		if p.Name == "" {
			continue
		}
		p.Name = filepath.Clean(p.Name)
		kept = append(kept, p)
	}
	return &Watcher{paths: kept, debounce: debounce, log: log, c: make(chan struct{}, 1)}
}

// C receives a value after changes settle.
func (w *Watcher) C() <-chan struct{} { return w.c }

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("fsnotify: %w", err)
	}
	defer fw.Close()
	w.sync(fw)

	var timer *time.Timer
	var fire <-chan time.Time
	// A change triggers once the paths have been quiet for a short settle (a file's
	// create, write and rename are read together), and a stream of changes that never
	// goes quiet triggers at least every debounce (an rsync of many files is read in a
	// few passes, not one a file). A lone change, or one soon after imagepind's own
	// write of its drop-in, waits only the settle.
	settle := min(w.debounce/10, 25*time.Millisecond)
	var first time.Time // the first change not triggered yet
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("fsnotify closed")
			}
			if !w.relevant(ev.Name) {
				continue // the status file next to the labels file, say: none of ours
			}
			// One of ours came or went (a directory created, removed, renamed over):
			// watch what exists now. A write needs no new watch.
			if ev.Has(fsnotify.Create) || ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				w.sync(fw)
			}
			w.log.WithField("path", ev.Name).WithField("op", ev.Op.String()).Debug("file event")
			now := time.Now()
			if fire == nil {
				first = now
			}
			wait := min(settle, first.Add(w.debounce).Sub(now))
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			fire = timer.C
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("fsnotify closed")
			}
			// An overflow loses events: treat it as a change of everything.
			w.log.WithError(err).Warn("file watch error; re-reading everything")
			w.trigger()
		case <-fire:
			fire = nil
			w.trigger()
		}
	}
}

// relevant says whether a changed path is one of ours: a watched file itself, a watched
// directory, or anything under a watched directory. Parent directories are watched only
// to see our paths come and go; their other entries (the status file next to the
// labels file, say) are not our business.
func (w *Watcher) relevant(name string) bool {
	name = filepath.Clean(name)
	for _, p := range w.paths {
		if name == p.Name || strings.HasPrefix(name, p.Name+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

func (w *Watcher) trigger() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// sync adds a watch on every path that exists, its parent, and for recursive paths its
// subdirectories. Adding a watch twice is harmless; a removed directory drops its
// watch by itself.
func (w *Watcher) sync(fw *fsnotify.Watcher) {
	watched := map[string]bool{}
	for _, p := range fw.WatchList() {
		watched[p] = true
	}
	add := func(dir string) {
		if watched[dir] {
			return
		}
		if err := fw.Add(dir); err == nil {
			watched[dir] = true
		}
	}
	for _, p := range w.paths {
		add(filepath.Dir(p.Name))
		fi, err := os.Stat(p.Name)
		if err != nil || !fi.IsDir() {
			continue
		}
		if !p.Recursive {
			add(p.Name)
			continue
		}
		_ = filepath.WalkDir(p.Name, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				add(path)
			}
			return nil
		})
	}
}
