package check

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/utils/clock"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/status"
)

// Registry says which manifest a tag names (*registry.Client).
type Registry interface {
	ResolveTag(ctx context.Context, image string) (registry.Tag, error)
}

// Config are the check's period and width.
type Config struct {
	// Every is how often every tag is asked again (0: 10 minutes).
	Every time.Duration
	// Concurrency bounds the questions at once (0: 4).
	Concurrency int
	// Poll is how often the wanted tags are looked at for new ones (0: 5 seconds).
	Poll time.Duration
}

// Checker asks the registry about the tags Tags returns.
type Checker struct {
	cfg   Config
	reg   Registry
	tags  func() []pinset.Tag
	clock clock.WithTicker
	log   logrus.FieldLogger
	// OnChange is called after the moved tags changed (set before Run).
	OnChange func()

	mu    sync.Mutex
	moved map[string]status.MovedTag
	asked map[string]time.Time // when each tag (name=image) was last answered or asked
}

// New builds a checker of the tags returned by tags, asking reg.
func New(cfg Config, reg Registry, tags func() []pinset.Tag, clk clock.WithTicker, log logrus.FieldLogger) *Checker {
	if cfg.Every <= 0 {
		cfg.Every = 10 * time.Minute
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Second
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Checker{cfg: cfg, reg: reg, tags: tags, clock: clk, log: log, moved: map[string]status.MovedTag{}, asked: map[string]time.Time{}}
}

// Moved are the tags whose registry names another digest than the pinned one, by name.
func (c *Checker) Moved() []status.MovedTag {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]status.MovedTag, 0, len(c.moved))
	for _, m := range c.moved {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	return out
}

// Run checks until ctx ends.
func (c *Checker) Run(ctx context.Context) error {
	for {
		c.Pass(ctx)
		t := c.clock.NewTimer(c.cfg.Poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

func key(t pinset.Tag) string { return t.Name + "=" + t.Image }

// Pass asks about every tag due (new, or last asked Every ago) and forgets the tags no
// set pins any more.
func (c *Checker) Pass(ctx context.Context) {
	now := c.clock.Now()
	want := c.tags()
	var due []pinset.Tag
	c.mu.Lock()
	keep := map[string]bool{}
	for _, t := range want {
		keep[key(t)] = true
		if at, ok := c.asked[key(t)]; !ok || now.Sub(at) >= c.cfg.Every {
			due = append(due, t)
		}
	}
	changed := false
	for k := range c.asked {
		if !keep[k] {
			delete(c.asked, k)
		}
	}
	for name, m := range c.moved {
		if !keep[name+"="+m.Image()] {
			delete(c.moved, name)
			changed = true
		}
	}
	c.mu.Unlock()

	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, t := range due {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if c.check(ctx, t, now) {
				mu.Lock()
				changed = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if changed && c.OnChange != nil {
		c.OnChange()
	}
}

// check asks about t; changed says its moved state changed.
func (c *Checker) check(ctx context.Context, t pinset.Tag, now time.Time) bool {
	tag, err := c.reg.ResolveTag(ctx, t.Name)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked[key(t)] = now
	if err != nil {
		// The registry gone is what pinning is for: nothing known changes.
		c.log.WithError(err).WithField("tag", t.Name).Debug("pinned tag not checked against its registry")
		return false
	}
	prev, was := c.moved[t.Name]
	if tag.Digest.String() == t.Digest() {
		if was {
			delete(c.moved, t.Name)
			c.log.WithField("tag", t.Name).Info("pinned tag names the pinned digest again in its registry")
			return true
		}
		return false
	}
	m := status.MovedTag{Tag: t.Name, Pinned: t.Digest(), Registry: tag.Digest.String(), Since: now}
	if was && prev.Pinned == m.Pinned && prev.Registry == m.Registry {
		return false
	}
	if was && prev.Pinned == m.Pinned {
		m.Since = prev.Since
	}
	c.moved[t.Name] = m
	c.log.WithField("tag", t.Name).WithField("pinned", m.Pinned).WithField("registry", m.Registry).
		Warn("pinned tag moved in its registry; the node keeps and serves the pinned digest until the set changes")
	return true
}
