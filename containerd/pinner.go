package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/pin"
)

// Pinner implements the runtime port, follows containerd's image events and pins
// image records.
var (
	_ pin.Pinner       = (*Pinner)(nil)
	_ pin.Watcher      = (*Pinner)(nil)
	_ pin.RecordPinner = (*Pinner)(nil)
)

// ImageLabels is the part of containerd's images API the pinner uses.
type ImageLabels interface {
	// Labels returns an image record's labels; ErrNotFound when there is none.
	Labels(ctx context.Context, name string) (map[string]string, error)
	// SetPinned sets or removes the pinned label.
	SetPinned(ctx context.Context, name string, pinned bool) error
}

// Pinner is containerd's part of pinning: the pinned label on the image record of each
// reference imagepind pulled. A label applies at once (containerd's CRI plugin follows
// image events), so there is nothing to reload; a reference not on the node yet is
// labelled right after its pull (Pulled), the moment the pull returns. imagepind removes
// only labels it set: which ones is kept in Record, so that a label an administrator
// set by hand stays whatever the sets say.
type Pinner struct {
	Images ImageLabels
	// Events, when set, is followed by Watch (nil: no watch).
	Events EventSource
	// Namespace is containerd's CRI namespace, for logs.
	Namespace string
	// Record is the file that lists the labels imagepind set (in the state directory).
	Record string
	Log    logrus.FieldLogger

	mu sync.Mutex
	// batchMu guards next, the references waiting for the record's next write.
	batchMu sync.Mutex
	next    *recordBatch
	writes  int // of the record, for tests
	loaded  bool
	ours    map[string]bool // labels imagepind set
	want    map[string]bool // the last patterns written
	failed  int             // labels the last write could not set or remove
	dirty   map[string]bool // wanted records an event says changed
	// effective is the last list written, the same slice while it does not change.
	effective []string
	resync    bool // events were missed: look at every wanted record
}

// Describe names where the pins go, for logs.
func (p *Pinner) Describe() string {
	return fmt.Sprintf("containerd image labels %s=%s (namespace %s)", PinnedLabel, PinnedLabelValue, p.Namespace)
}

type record struct {
	// Labeled are the image records imagepind set the pinned label on.
	Labeled []string `json:"labeled"`
}

func (p *Pinner) load() {
	if p.loaded {
		return
	}
	p.loaded = true
	p.ours = map[string]bool{}
	b, err := fsutil.ReadRegular(p.Record, 16<<20)
	if err != nil {
		return
	}
	var r record
	if json.Unmarshal(b, &r) != nil {
		return
	}
	for _, ref := range r.Labeled {
		p.ours[ref] = true
	}
}

func (p *Pinner) save() error {
	p.writes++
	r := record{Labeled: make([]string, 0, len(p.ours))}
	for ref := range p.ours {
		r.Labeled = append(r.Labeled, ref)
	}
	sort.Strings(r.Labeled)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.Record), 0o700); err != nil {
		return err
	}
	return fsutil.WriteAtomic(p.Record, filepath.Dir(p.Record), b, 0o600)
}

// Held is every label imagepind set and has not removed.
func (p *Pinner) Held() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.load()
	held := make([]string, 0, len(p.ours))
	for ref := range p.ours {
		held = append(held, ref)
	}
	sort.Strings(held)
	return held
}

// Write labels every wanted image that is on the node and not pinned (an image the
// kubelet re-created after a removal carries no label), and removes imagepind's label
// from images no longer wanted. The record is written before a label is set and after
// one is removed, so a crash never leaves a label imagepind set that it does not know of.
func (p *Pinner) Write(ctx context.Context, patterns []string, images func(ref string) (present, pinned bool)) (pin.Written, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.load()
	p.want = make(map[string]bool, len(patterns))
	for _, ref := range patterns {
		p.want[ref] = true
	}
	var errs []error

	// Which wanted images lack the label: asked only of images on the node not known
	// to be pinned, and of those an event says changed, so a pass over a settled node
	// costs no call.
	var toLabel, recheck []string
	resynced := true
	for _, ref := range patterns {
		present, pinned := images(ref)
		changedBehind := p.dirty[ref] || p.resync
		if !changedBehind && (!present || (pinned && p.ours[ref])) {
			continue
		}
		labels, err := p.Images.Labels(ctx, ref)
		if errors.Is(err, ErrNotFound) {
			if present {
				recheck = append(recheck, ref) // deleted behind imagepind's back
			}
			delete(p.dirty, ref)
			continue
		}
		if err != nil {
			errs = append(errs, err)
			resynced = false
			if isDown(err) {
				break
			}
			continue
		}
		delete(p.dirty, ref)
		if labels[PinnedLabel] == PinnedLabelValue {
			// Labelled already: by imagepind (the runtime's pinned flag is late), or by
			// someone else, whose label imagepind leaves alone.
			if !present || !pinned {
				recheck = append(recheck, ref)
			}
			continue
		}
		toLabel = append(toLabel, ref)
		recheck = append(recheck, ref)
	}
	if resynced {
		p.resync = false
	}
	var toUnlabel []string
	for ref := range p.ours {
		if !p.want[ref] {
			toUnlabel = append(toUnlabel, ref)
		}
	}
	sort.Strings(toUnlabel)

	changed := false
	if len(toLabel) > 0 {
		for _, ref := range toLabel {
			p.ours[ref] = true
		}
		if err := p.save(); err != nil {
			for _, ref := range toLabel {
				delete(p.ours, ref)
			}
			return pin.Written{Effective: slices.Clone(patterns)}, fmt.Errorf("record of containerd labels %s: %w", p.Record, err)
		}
		for _, ref := range toLabel {
			if err := p.Images.SetPinned(ctx, ref, true); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
				if isDown(err) {
					break
				}
				continue
			}
			changed = true
		}
	}
	removed := false
	for _, ref := range toUnlabel {
		if len(errs) > 0 && isDown(errs[len(errs)-1]) {
			break // containerd does not answer: the rest waits for the next pass
		}
		labels, err := p.Images.Labels(ctx, ref)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			errs = append(errs, err)
			continue
		case labels[PinnedLabel] != "":
			if err := p.Images.SetPinned(ctx, ref, false); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			changed = true
		}
		delete(p.ours, ref)
		removed = true
	}
	if removed {
		if err := p.save(); err != nil {
			errs = append(errs, fmt.Errorf("record of containerd labels %s: %w", p.Record, err))
		}
	}
	p.failed = len(errs)
	p.effective = pin.Stable(p.effective, patterns)
	w := pin.Written{Changed: changed, Effective: p.effective, Recheck: recheck}
	if len(errs) > 0 {
		return w, fmt.Errorf("containerd image labels: %w", errors.Join(errs...))
	}
	return w, nil
}

// isDown says whether containerd did not answer (unavailable, or past a call's
// deadline): asking about more images is pointless.
func isDown(err error) bool { return errors.Is(err, cri.ErrUnavailable) }

// PinsRecords says that containerd pins image records, not names: an image is pinned
// once its record exists and carries the label.
func (p *Pinner) PinsRecords() bool { return true }

// Apply does nothing: containerd's CRI plugin follows label changes by itself.
func (p *Pinner) Apply(context.Context) error { return nil }

// InEffect says whether the last write set and removed every label it had to. The CRI
// plugin learns of a label by an event a few milliseconds later; the agent's check of a
// newly pinned image's CRI pinned flag covers that.
func (p *Pinner) InEffect(context.Context, []string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed > 0 {
		return false, fmt.Errorf("%d containerd image labels could not be changed", p.failed)
	}
	return true, nil
}

// Pulled labels an image imagepind just pulled, if a set wants it, unless it carries the
// label already (then it is pinned, by imagepind or by someone else). It says whether
// the image is pinned now: its record exists and carries the label (containerd's CRI
// plugin reports it pinned once it has the image event, a few milliseconds on).
func (p *Pinner) Pulled(ctx context.Context, ref string) (bool, error) {
	p.mu.Lock()
	p.load()
	want := p.want[ref]
	p.mu.Unlock()
	if !want {
		return false, nil
	}
	// The calls run unlocked: pulls finish many at once.
	labels, err := p.Images.Labels(ctx, ref)
	if err != nil {
		return false, err
	}
	if labels[PinnedLabel] == PinnedLabelValue {
		return true, nil
	}
	if err := p.record(ref); err != nil {
		return false, fmt.Errorf("record of containerd labels %s: %w", p.Record, err)
	}
	if err := p.Images.SetPinned(ctx, ref, true); err != nil {
		return false, err
	}
	return true, nil
}

// recordBatch is references whose pulls returned while the record was being written:
// the next write records them all (a group commit), so pulls that finish together
// wait for one write of the record, not one each (a write is two fsyncs, and a pull
// holds its slot until its label is set).
type recordBatch struct {
	refs []string
	done chan struct{}
	err  error
}

// record adds ref to the labels imagepind set, on disk, before its label is set.
func (p *Pinner) record(ref string) error {
	p.batchMu.Lock()
	if p.next == nil {
		p.next = &recordBatch{done: make(chan struct{})}
	}
	b := p.next
	b.refs = append(b.refs, ref)
	p.batchMu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-b.done: // written by a caller of the same batch while this one waited
		return b.err
	default:
	}
	// The first of the batch to hold the lock writes it; none joins it after.
	p.batchMu.Lock()
	if p.next == b {
		p.next = nil
	}
	p.batchMu.Unlock()
	var added []string
	for _, r := range b.refs {
		if !p.ours[r] {
			p.ours[r] = true
			added = append(added, r)
		}
	}
	if len(added) > 0 {
		if b.err = p.save(); b.err != nil {
			for _, r := range added {
				delete(p.ours, r)
			}
		}
	}
	close(b.done)
	return b.err
}

// Support is what a containerd version does with pins: the CRI plugin reads the pinned
// label and reports CRI Image.pinned from 1.7.
func (p *Pinner) Support(version string) (pin.Support, error) {
	return SupportOf(version)
}

// SupportOf says what containerd version (as CRI Version reports it: "v2.2.9", "1.7.24")
// does with pins. An unparsable version is assumed current.
func SupportOf(version string) (pin.Support, error) {
	ok := pin.Support{PinnedField: true, WithoutRestart: true}
	s := strings.TrimPrefix(strings.TrimSpace(version), "v")
	if i := strings.IndexAny(s, "-+~"); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return ok, fmt.Errorf("containerd version %q is not major.minor.patch", version)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return ok, fmt.Errorf("containerd version %q is not major.minor.patch", version)
	}
	if major < 1 || (major == 1 && minor < 7) {
		return pin.Support{Problem: fmt.Sprintf("containerd %s does not pin images (its CRI plugin reads the %s label from 1.7): images are pulled but cannot be pinned; upgrade containerd", version, PinnedLabel)}, nil
	}
	return ok, nil
}
