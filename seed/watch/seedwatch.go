package seedwatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/seed"
	"github.com/imagepin/imagepin/watch"
)

// Config is the watched directory.
type Config struct {
	// Dir is the directory watched (absolute).
	Dir string
	// SeedsDir holds the seed records (seed.Dir(state_dir)): the media they name.
	SeedsDir string
	// Settle is how long a medium stays unchanged, unwritten, before it is seeded.
	Settle time.Duration
	// Rescan is how often the directory is read again without a change seen (a
	// medium mounted or written over NFS raises no event here); 0: DefaultRescan.
	Rescan time.Duration
}

// DefaultRescan is Config.Rescan when none is set.
const DefaultRescan = time.Minute

// Seeder is what of seed.Seeder the watcher uses.
type Seeder interface {
	Seed(ctx context.Context, path string) (*seed.Summary, error)
	Forget(ctx context.Context, path string, pinned []string, except string) ([]*seed.Removed, error)
}

// Deps are the watcher's collaborators; nil ones take their defaults.
type Deps struct {
	Seeder Seeder
	// Pinned are the references pinned now (what a removed seed keeps).
	Pinned func() ([]string, error)
	Log    logrus.FieldLogger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Writing says whether a process holds a file under path open for writing
	// (default: the processes' open files in /proc).
	Writing func(path string) (bool, error)
}

// Watcher seeds what comes into Config.Dir and forgets what leaves it.
type Watcher struct {
	cfg  Config
	deps Deps
	// media are the entries seen, by path.
	media map[string]*medium
	// fingerprint reads a medium's fingerprint (fingerprintOf; tests make it fail).
	fingerprint func(path string) (fingerprint, error)
	// reported are the media's faults last written (seed.WriteMediaFaults); nil: none
	// written by this run yet.
	reported []seed.MediaFault
	// carried are the faults an earlier run wrote, by path: shown for a medium still
	// there until this run has tried it (a refused medium stays shown across restarts).
	carried map[string]string
}

// medium is what the watcher knows of one entry.
type medium struct {
	seen  fingerprint // as last read
	since time.Time   // unchanged since
	done  fingerprint // seeded (or found recorded) as this
	// failed is the fingerprint a seed failed on; tried again when it changes, or
	// (not a bad medium: no space, say) at retryAt.
	failed  fingerprint
	retryAt time.Time
	// fault says why the seed of failed failed, for the node's status.
	fault string
}

// New builds a watcher; Run starts it.
func New(cfg Config, deps Deps) *Watcher {
	if cfg.Rescan <= 0 {
		cfg.Rescan = DefaultRescan
	}
	cfg.Dir = filepath.Clean(cfg.Dir)
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Writing == nil {
		deps.Writing = writing
	}
	if deps.Pinned == nil {
		deps.Pinned = func() ([]string, error) { return nil, nil }
	}
	return &Watcher{cfg: cfg, deps: deps, media: map[string]*medium{}, fingerprint: fingerprintOf}
}

// Run watches until ctx ends: a scan at start, at each change of the directory, while
// a medium settles, and every Rescan.
func (w *Watcher) Run(ctx context.Context) error {
	fw := watch.New(w.cfg.Settle/4, w.deps.Log, watch.Path{Name: w.cfg.Dir})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	werr := make(chan error, 1)
	go func() { werr <- fw.Run(wctx) }()
	w.deps.Log.WithField("directory", w.cfg.Dir).WithField("settle", w.cfg.Settle).Info("seed directory: watching")
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-werr:
			if ctx.Err() != nil {
				return nil
			}
			// No events: the directory is read every Rescan still.
			w.deps.Log.WithError(err).WithField("directory", w.cfg.Dir).WithField("every", w.cfg.Rescan).
				Error("seed directory: its changes are not watched; it is read again periodically")
			werr = nil
			continue
		case <-fw.C():
		case <-timer.C:
		}
		next := w.Scan(ctx)
		timer.Reset(next.Sub(w.deps.Now()))
	}
}

// Scan reads the directory once: it seeds the media settled, forgets those gone, and
// says when to scan again.
func (w *Watcher) Scan(ctx context.Context) (next time.Time) {
	now := w.deps.Now()
	next = now.Add(w.cfg.Rescan)
	soon := func(t time.Time) {
		if t.Before(next) {
			next = t
		}
	}
	present, unreadable, err := w.entries()
	if err != nil {
		w.deps.Log.WithError(err).WithField("directory", w.cfg.Dir).Warn("seed directory: cannot be read; nothing is seeded or removed until it can")
		w.report(now, []seed.MediaFault{{Path: w.cfg.Dir, Fault: fmt.Sprintf("cannot be read (%v): nothing is seeded or removed until it can", err)}})
		return next
	}
	recorded, err := w.recorded()
	if err != nil {
		w.deps.Log.WithError(err).Warn("seed directory: the seed records cannot be read; nothing is seeded or removed until they can")
		return next
	}
	if w.carried == nil {
		w.carried = map[string]string{}
		if old, err := seed.ReadMediaFaults(w.cfg.SeedsDir); err == nil && old != nil && old.Directory == w.cfg.Dir {
			for _, f := range old.Media {
				w.carried[f.Path] = f.Fault
			}
		}
	}
	defer func() { w.report(now, w.faults(unreadable)) }()
	for path := range w.media {
		_, here := present[path]
		_, kept := unreadable[path]
		if !here && !kept {
			delete(w.media, path)
		}
	}
	for path := range w.carried {
		if _, here := present[path]; !here {
			delete(w.carried, path)
		}
	}
	for path, fp := range present {
		if ctx.Err() != nil {
			return next
		}
		m := w.media[path]
		if m == nil {
			m = &medium{}
			w.media[path] = m
		}
		if fp != m.seen {
			m.seen, m.since = fp, now
		}
		switch {
		case fp.empty() || fp == m.done:
			continue
		case fp == m.failed && (m.retryAt.IsZero() || now.Before(m.retryAt)):
			if !m.retryAt.IsZero() {
				soon(m.retryAt)
			}
			continue
		case now.Sub(m.since) < w.cfg.Settle:
			soon(m.since.Add(w.cfg.Settle))
			continue
		}
		busy, err := w.deps.Writing(path)
		if err != nil {
			// The settle time alone decides.
			w.deps.Log.WithError(err).WithField("medium", path).Debug("seed directory: cannot tell whether the medium is being written")
		}
		if busy {
			// Being written: it settles again from now.
			m.since = now
			soon(now.Add(w.cfg.Settle))
			continue
		}
		w.seed(ctx, path, m, now, soon)
	}
	w.forget(ctx, present, unreadable, recorded)
	return next
}

func (w *Watcher) seed(ctx context.Context, path string, m *medium, now time.Time, soon func(time.Time)) {
	log := w.deps.Log.WithField("medium", path)
	start := w.deps.Now()
	sum, err := w.deps.Seeder.Seed(ctx, path)
	switch {
	case err == nil:
		m.done = m.seen
		m.failed, m.retryAt, m.fault = fingerprint{}, time.Time{}, ""
		log.WithField("seed", sum.ID).WithField("images", len(sum.Images)).WithField("bytes", sum.Bytes).
			WithField("written", sum.Written).WithField("took", w.deps.Now().Sub(start).Round(time.Millisecond)).Info("seed directory: seeded")
		// A medium replaced by another at its path (the next release's archive under
		// the same name): the seed of the one it replaced goes.
		w.drop(ctx, path, sum.ID)
	case ctx.Err() != nil:
		// Stopping: the next start resumes it.
	case errors.Is(err, seed.ErrLocked):
		// imagepinctl seed at work: again in a moment.
		soon(now.Add(w.cfg.Settle))
	case errors.Is(err, seed.ErrBadMedia):
		m.failed, m.retryAt = m.seen, time.Time{}
		m.fault = fmt.Sprintf("refused, nothing of it stored: %v; take it away, or replace it", err)
		log.WithError(err).Error("seed directory: the medium is refused; it is tried again when it changes")
	default:
		m.failed, m.retryAt = m.seen, now.Add(w.cfg.Rescan)
		m.fault = fmt.Sprintf("not seeded: %v; tried again at %s", err, m.retryAt.UTC().Format(time.RFC3339))
		soon(m.retryAt)
		log.WithError(err).Error("seed directory: seeding failed; tried again later")
	}
}

// faults are the media not seeded for a fault of theirs: those that cannot be read
// now, and those whose last seed failed, unchanged since.
func (w *Watcher) faults(unreadable map[string]error) []seed.MediaFault {
	out := []seed.MediaFault{}
	for path, err := range unreadable {
		out = append(out, seed.MediaFault{Path: path, Fault: fmt.Sprintf("cannot be read (%v): its seed, if it has one, is kept; nothing is seeded from it until it can be read", err)})
	}
	for path, m := range w.media {
		if _, bad := unreadable[path]; bad {
			continue
		}
		switch {
		case m.fault != "" && m.failed == m.seen:
			out = append(out, seed.MediaFault{Path: path, Fault: m.fault})
		case m.done == (fingerprint{}) && m.failed == (fingerprint{}) && w.carried[path] != "":
			out = append(out, seed.MediaFault{Path: path, Fault: w.carried[path]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// report writes the media's faults for the node's status and imagepinctl seed --list
// when they changed (and once at start: what an earlier run wrote is not true now).
func (w *Watcher) report(now time.Time, faults []seed.MediaFault) {
	if w.reported != nil && slices.Equal(faults, w.reported) {
		return
	}
	if err := seed.WriteMediaFaults(w.cfg.SeedsDir, seed.MediaFaults{Directory: w.cfg.Dir, Updated: now.UTC(), Media: faults}); err != nil {
		w.deps.Log.WithError(err).Warn("seed directory: its media's faults are not shown in the node's status")
		return
	}
	w.reported = faults
}

// forget takes the media recorded in the directory but gone from it (or empty now)
// out of their seeds. A medium that cannot be read is not gone: its seed stays.
func (w *Watcher) forget(ctx context.Context, present map[string]fingerprint, unreadable map[string]error, recorded map[string]bool) {
	for path := range recorded {
		if filepath.Dir(path) != w.cfg.Dir {
			continue // seeded from elsewhere
		}
		if fp, ok := present[path]; ok && !fp.empty() {
			continue
		}
		if _, ok := unreadable[path]; ok {
			continue
		}
		if !w.drop(ctx, path, "") {
			return
		}
	}
}

// drop takes the medium at path out of the seeds but except's (Seeder.Forget); false
// when the watcher should stop for this scan (the pins or the lock not to be had).
func (w *Watcher) drop(ctx context.Context, path, except string) bool {
	log := w.deps.Log.WithField("medium", path)
	pinned, err := w.deps.Pinned()
	if err != nil {
		log.WithError(err).Warn("seed directory: the pins cannot be read; the seed of the medium taken away stays for now")
		return false
	}
	removed, err := w.deps.Seeder.Forget(ctx, path, pinned, except)
	switch {
	case errors.Is(err, seed.ErrNoSeed):
	case errors.Is(err, seed.ErrLocked):
		return false // next scan
	case err != nil:
		log.WithError(err).Error("seed directory: the seed of the medium taken away was not removed")
	case len(removed) == 0:
		log.Info("seed directory: medium taken away; its seed stays, from its other media")
	default:
		for _, r := range removed {
			log.WithField("seed", r.ID).WithField("removed", r.Blobs).WithField("bytes", r.Bytes).WithField("kept", r.Kept).
				Info("seed directory: medium taken away or replaced; its seed is removed")
		}
	}
	return true
}

// entries are the media in the directory now, with their fingerprints, and those that
// cannot be read (an I/O error, a stale share, a name too long, a file going while it
// is read), with why. A medium is gone only when its own entry is.
func (w *Watcher) entries() (map[string]fingerprint, map[string]error, error) {
	ents, err := os.ReadDir(w.cfg.Dir)
	if err != nil {
		return nil, nil, err
	}
	out := map[string]fingerprint{}
	unreadable := map[string]error{}
	for _, e := range ents {
		if partial(e.Name()) {
			continue
		}
		path := filepath.Join(w.cfg.Dir, e.Name())
		fp, err := w.fingerprint(path)
		switch {
		case errors.Is(err, errGone):
			// Renamed or removed since the directory was read: gone.
			w.deps.Log.WithField("medium", path).Debug("seed directory: entry gone as it was read")
		case err != nil:
			w.deps.Log.WithError(err).WithField("medium", path).Warn("seed directory: medium cannot be read; its seed stays, nothing is seeded from it until it can be read")
			unreadable[path] = err
		default:
			out[path] = fp
		}
	}
	return out, unreadable, nil
}

// partial says whether an entry's name is one a copy in progress uses (rsync's
// .name.XXXXXX, a browser's .part, a .tmp) or a hidden one: not a medium.
func partial(name string) bool {
	if strings.HasPrefix(name, ".") {
		return true
	}
	for _, ext := range []string{".part", ".partial", ".tmp", ".crdownload", ".download"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// recorded are the media the seed records name (complete or pending), by path.
func (w *Watcher) recorded() (map[string]bool, error) {
	recs, err := seed.Records(w.cfg.SeedsDir)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range recs {
		for _, m := range r.Media {
			out[m.Path] = true
		}
	}
	return out, nil
}
