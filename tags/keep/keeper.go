package keep

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
	"k8s.io/utils/clock"

	"github.com/imagepin/imagepin/pinset"
)

// Runtime makes the runtime hold tags.
type Runtime interface {
	// Ensure makes t.Name mean t.Image on the node. held false: the digest is not on
	// the node yet (nothing to tag; try again later).
	Ensure(ctx context.Context, t pinset.Tag) (held bool, err error)
	// Forget undoes what Ensure made of the tags not in want, where the runtime keeps
	// something of its own for them (containerd's records).
	Forget(ctx context.Context, want []pinset.Tag) error
}

// Watcher is a Runtime that says when what it holds may have changed (containerd's
// image events): the keeper then passes at once.
type Watcher interface {
	Watch(ctx context.Context, changed func()) error
}

// Config are the keeper's periods.
type Config struct {
	// Every is how often every tag is checked (a record removed behind imagepind's
	// back comes back within it); 0: a minute.
	Every time.Duration
	// Retry is how soon a pass runs again while a tag waits for its digest or failed;
	// 0: 5 seconds.
	Retry time.Duration
}

// Keeper holds the wanted tags and runs the loop that makes the runtime hold them.
type Keeper struct {
	cfg   Config
	rt    Runtime
	clock clock.WithTicker
	log   logrus.FieldLogger
	// OnChange is called after a pass changed which tags are held or failed (set
	// before Run).
	OnChange func()

	mu sync.Mutex
	// want are the tags wanted, by name; byRepo the same for Lookup.
	want   []pinset.Tag
	byRepo map[string]map[string]digest.Digest
	// held are the tags the runtime held at the last pass, each as the digest it was
	// made to mean then (a tag a set moves to another digest is not held until a pass
	// makes it so); faults the last errors, the same way.
	held   map[pinset.Tag]bool
	faults map[pinset.Tag]string
	// waiting are the images (repo@sha256:…) of the tags the last pass found not on the
	// node yet: Arrived wakes the loop when one comes.
	waiting map[string]bool
	// passing: a pass is under way (an image that arrives meanwhile may have been asked
	// for before it came).
	passing bool
	wake    chan struct{}
}

// New builds a keeper over rt (nil: no runtime; Lookup still answers); Run starts it.
func New(cfg Config, rt Runtime, clk clock.WithTicker, log logrus.FieldLogger) *Keeper {
	if cfg.Every <= 0 {
		cfg.Every = time.Minute
	}
	if cfg.Retry <= 0 {
		cfg.Retry = 5 * time.Second
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Keeper{cfg: cfg, rt: rt, clock: clk, log: log, byRepo: map[string]map[string]digest.Digest{},
		held: map[pinset.Tag]bool{}, faults: map[pinset.Tag]string{}, waiting: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Want sets the tags wanted (the desired sets' tags, pinset.TagsOf); a change wakes the
// loop. It never blocks.
func (k *Keeper) Want(tags []pinset.Tag) {
	tags = slices.Clone(tags)
	sort.Slice(tags, func(i, j int) bool { return tags[i].Name < tags[j].Name })
	k.mu.Lock()
	if slices.Equal(tags, k.want) {
		k.mu.Unlock()
		return
	}
	k.want = tags
	k.byRepo = map[string]map[string]digest.Digest{}
	for _, t := range tags {
		d, err := digest.Parse(t.Digest())
		if err != nil {
			continue
		}
		if k.byRepo[t.Repo()] == nil {
			k.byRepo[t.Repo()] = map[string]digest.Digest{}
		}
		k.byRepo[t.Repo()][t.TagOnly()] = d
	}
	k.mu.Unlock()
	k.poke()
}

func (k *Keeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Arrived says that image (repo@sha256:…, a pinned reference) is on the node now: a
// pull of it ended. When a tag waits for it, the loop passes at once rather than at its
// next retry (Config.Retry), so the tag is held as soon as its digest is. It never
// blocks.
func (k *Keeper) Arrived(image string) {
	k.mu.Lock()
	waits := k.waiting[image] || k.passing
	k.mu.Unlock()
	if waits {
		k.poke()
	}
}

// Lookup is the pinned digest of repo:tag, when a set pins that tag.
func (k *Keeper) Lookup(repo, tag string) (digest.Digest, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	d, ok := k.byRepo[repo][tag]
	return d, ok
}

// Runs says whether the keeper has a runtime to make hold the tags.
func (k *Keeper) Runs() bool { return k.rt != nil }

// Tags are the wanted tags.
func (k *Keeper) Tags() []pinset.Tag {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.want)
}

// Held says whether the runtime held t.Name as t.Image at the last pass: a tag held
// as another digest (the one a set pinned before) is not.
func (k *Keeper) Held(t pinset.Tag) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.held[t]
}

// Faults are the wanted tags the last pass could not make, each with why, by name.
func (k *Keeper) Faults() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := []string{}
	for _, t := range k.want {
		if why, ok := k.faults[t]; ok {
			out = append(out, fmt.Sprintf("tag %s: %s", t.Name, why))
		}
	}
	return out
}

// Run makes the runtime hold the wanted tags until ctx ends: at once when they change,
// every Config.Every, and every Config.Retry while one waits or failed.
func (k *Keeper) Run(ctx context.Context) error {
	if k.rt == nil {
		<-ctx.Done()
		return nil
	}
	if w, ok := k.rt.(Watcher); ok {
		go w.Watch(ctx, k.poke)
	}
	for {
		next := k.cfg.Every
		if !k.Pass(ctx) {
			next = k.cfg.Retry
		}
		t := k.clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-k.wake:
			t.Stop()
		case <-t.C():
		}
	}
}

// Pass makes the runtime hold each wanted tag once; done says every one is held.
func (k *Keeper) Pass(ctx context.Context) (done bool) {
	k.mu.Lock()
	k.passing = true
	want := slices.Clone(k.want)
	k.mu.Unlock()
	held := map[pinset.Tag]bool{}
	faults := map[pinset.Tag]string{}
	waiting := map[string]bool{}
	done = true
	for _, t := range want {
		if ctx.Err() != nil {
			k.mu.Lock()
			k.passing = false
			k.mu.Unlock()
			return false
		}
		ok, err := k.rt.Ensure(ctx, t)
		switch {
		case err != nil:
			faults[t] = err.Error()
			done = false
			k.mu.Lock()
			was := k.faults[t]
			k.mu.Unlock()
			if was != err.Error() {
				k.log.WithError(err).WithField("tag", t.Name).Warn("tag not pre-loaded")
			}
		case !ok:
			waiting[t.Image] = true
			done = false
		default:
			held[t] = true
			k.mu.Lock()
			was := k.held[t]
			k.mu.Unlock()
			if !was {
				k.log.WithField("tag", t.Name).WithField("image", t.Image).Info("tag pre-loaded as its pinned digest")
			}
		}
	}
	if err := k.rt.Forget(ctx, want); err != nil {
		k.log.WithError(err).Warn("forgetting tags no set pins")
		done = false
	}
	k.mu.Lock()
	changed := !maps.Equal(k.held, held) || !maps.Equal(k.faults, faults)
	k.held, k.faults, k.waiting, k.passing = held, faults, waiting, false
	k.mu.Unlock()
	if changed && k.OnChange != nil {
		k.OnChange()
	}
	return done
}
