package containerd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/imagepin/imagepin/pinset"
)

// TagLabel marks the image records imagepind made for pinned tags; its value is the
// digest reference the tag stands for.
const TagLabel = "imagepin.io/tag-of"

// RecordStore is the part of containerd's images API the tag records need (Images).
type RecordStore interface {
	Get(ctx context.Context, name string) (Record, error)
	Put(ctx context.Context, name string, r Record) error
	Delete(ctx context.Context, name string) error
	Labeled(ctx context.Context, label string) ([]string, error)
}

// TagRecords makes containerd know a pinned tag: an image record repo:tag with the
// target of the digest's record, pinned like it, so that the CRI plugin finds the tag
// (its image ID is the digest's) and the kubelet's garbage collector keeps it. A record
// of that name is made to match whatever it held (a pull of the tag from a registry
// whose tag moved); records imagepind made for tags no set pins any more are deleted.
type TagRecords struct {
	Images RecordStore
	// Events, when set, is followed by Watch (nil: no watch).
	Events EventSource
}

// Watch calls changed after every image event of the namespace (a tag's record deleted
// or replaced, a digest's record made), resubscribing with backoff until ctx ends: a
// pass then puts right what changed, at once rather than at the next period.
func (r *TagRecords) Watch(ctx context.Context, changed func()) error {
	if r.Events == nil {
		return nil
	}
	delay := 250 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		_ = r.Events.ImageEvents(ctx, func(ImageEvent) { changed() })
		if time.Since(start) > time.Minute {
			delay = 250 * time.Millisecond
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
		changed() // events may have been missed
	}
	return nil
}

// Ensure makes the record t.Name hold t.Image's target; held false while the digest
// has no record (not pulled yet).
func (r *TagRecords) Ensure(ctx context.Context, t pinset.Tag) (bool, error) {
	img, err := r.Images.Get(ctx, t.Image)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	cur, err := r.Images.Get(ctx, t.Name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return false, err
	}
	if err == nil && sameTarget(cur, img) && cur.Labels[TagLabel] == t.Image && cur.Labels[PinnedLabel] == PinnedLabelValue {
		return true, nil
	}
	labels := maps.Clone(img.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[PinnedLabel] = PinnedLabelValue
	labels[TagLabel] = t.Image
	if err := r.Images.Put(ctx, t.Name, Record{Target: img.Target, Labels: labels}); err != nil {
		return false, fmt.Errorf("record %s as %s: %w", t.Name, t.Image, err)
	}
	return true, nil
}

func sameTarget(a, b Record) bool {
	return a.Target != nil && b.Target != nil && a.Target.GetDigest() == b.Target.GetDigest() &&
		a.Target.GetMediaType() == b.Target.GetMediaType() && a.Target.GetSize() == b.Target.GetSize()
}

// Forget deletes the records imagepind made for tags not in want.
func (r *TagRecords) Forget(ctx context.Context, want []pinset.Tag) error {
	names, err := r.Images.Labeled(ctx, TagLabel)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, t := range want {
		keep[t.Name] = true
	}
	var errs []error
	for _, name := range names {
		if keep[name] {
			continue
		}
		if err := r.Images.Delete(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
