package crio

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/imagepin/imagepin/pin"
)

// Pinner implements the runtime port.
var _ pin.Pinner = (*Pinner)(nil)

// Pinner is CRI-O's part of pinning: one managed drop-in holding imagepind's patterns
// and the pinned_images of CRI-O's config files read before it (ours replaces theirs),
// put in effect by a reload and confirmed by CRI-O's live config.
type Pinner struct {
	DropIn DropIn
	Live   interface {
		PinnedImages(ctx context.Context) ([]string, error)
	}
	Reloader interface {
		Reload(ctx context.Context) error
	}
	// Settle is how long Apply waits after the reload before anyone reads CRI-O's
	// config (ReloadSettle on a node; 0 in tests with a fake CRI-O).
	Settle time.Duration

	lastEffective []string
}

// Describe names where the pins go, for logs.
func (p *Pinner) Describe() string { return "CRI-O drop-in " + p.DropIn.Path() }

// Held is every pattern of the managed drop-in on disk that is imagepind's own (not
// copied in from another config file): what imagepind pinned before a restart.
func (p *Pinner) Held() []string {
	files := p.DropIn.Scan()
	inherited := pin.PatternSet(p.DropIn.Existing(files).Inherited)
	var held []string
	for _, f := range files {
		if !f.Managed || f.Err != nil {
			continue
		}
		for _, pat := range f.Pins {
			if !inherited[strings.ToLower(pat)] {
				held = append(held, pat)
			}
		}
	}
	return held
}

// Write makes the managed drop-in hold patterns and the other files' patterns. Presence
// does not matter to CRI-O: a pattern pins whatever is pulled by that name later.
func (p *Pinner) Write(_ context.Context, patterns []string, _ func(string) (bool, bool)) (pin.Written, error) {
	var w pin.Written
	files := p.DropIn.Scan()
	existing := p.DropIn.Existing(files)
	for _, e := range existing.Errors {
		w.Faults = append(w.Faults, fmt.Sprintf("CRI-O config file %v (CRI-O cannot reload until it is fixed)", e))
	}
	for _, s := range existing.Skipped {
		w.Faults = append(w.Faults, "not copied into the managed drop-in: "+s)
	}
	all := make([]string, 0, len(patterns)+len(existing.Inherited))
	all = append(all, patterns...)
	all = append(all, existing.Inherited...)
	sort.Strings(all)
	all = slices.Compact(all)
	changed, err := p.DropIn.Apply(all)
	if err != nil {
		w.Faults = append(w.Faults, "managed drop-in: "+err.Error())
		return w, fmt.Errorf("write managed drop-in: %w", err)
	}
	var ours []string
	if len(all) > 0 {
		ours = all
	}
	w.Changed = changed
	p.lastEffective = pin.Stable(p.lastEffective, p.DropIn.Effective(files, ours))
	w.Effective = p.lastEffective
	w.Overriders = existing.Overriders
	return w, nil
}

// ReloadSettle is how long a reload is left alone before CRI-O's config is read. CRI-O
// (1.34 to 1.36.3 alike) re-reads its config on SIGHUP without a lock, and GET /config
// (like CRI Status) walks the runtime-handler map that the reload replaces and, when a
// configured handler fails validation (crun configured but not installed), deletes from
// (pkg/config ValidateRuntimes): a read
// at that moment is "concurrent map iteration and map write", which kills CRI-O (seen
// in our CI: exit status 2). A reload takes ~15 ms on an idle node; 100 ms is a margin
// under load, paid once per pin change.
const ReloadSettle = 100 * time.Millisecond

// Apply reloads CRI-O and lets the reload run (Settle) before InEffect reads the result.
// The reload only sends SIGHUP: CRI-O re-reads its config after the call returns.
func (p *Pinner) Apply(ctx context.Context) error {
	if err := p.Reloader.Reload(ctx); err != nil {
		return fmt.Errorf("reload CRI-O: %w", err)
	}
	if p.Settle <= 0 {
		return nil
	}
	t := time.NewTimer(p.Settle)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reload CRI-O: %w", ctx.Err())
	}
}

// InEffect says whether CRI-O's live config (GET /config) has exactly effective.
func (p *Pinner) InEffect(ctx context.Context, effective []string) (bool, error) {
	live, err := p.Live.PinnedImages(ctx)
	if err != nil {
		return false, fmt.Errorf("CRI-O's config cannot be read: %w", err)
	}
	if !pin.SamePatterns(live, effective) {
		return false, fmt.Errorf("CRI-O has %d pinned_images patterns, not the expected %d (a reload that failed is only in CRI-O's log)", len(live), len(effective))
	}
	return true, nil
}

// Pulled does nothing: CRI-O's patterns pin an image as it is pulled.
func (p *Pinner) Pulled(context.Context, string) (bool, error) { return false, nil }

// Support is what this CRI-O version does with pins.
func (p *Pinner) Support(version string) (pin.Support, error) {
	s, err := SupportOf(version)
	return pin.Support{PinnedField: s.PinnedField, WithoutRestart: s.PinOnReload, Problem: s.TooOld(version)}, err
}
