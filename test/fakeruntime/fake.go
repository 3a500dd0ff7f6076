// Package fakeruntime is an in-memory stand-in for CRI-O and containerd for unit tests: CRI
// image calls; for CRI-O the live config (GET /config) and a reload that re-reads the
// real drop-in files the way CRI-O does (the last file that sets pinned_images wins);
// for containerd the images API's pinned label on each image record, which CRI
// ImageStatus reports. The conformance suite in package pin/pintest runs against both and
// against real CRI-O and containerd.
package fakeruntime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pullcreds"
)

// Runtime fakes CRI-O.
type Runtime struct {
	mu sync.Mutex

	// Name is the runtime's CRI name: "cri-o" (New) or "containerd" (NewContainerd).
	Name    string
	Ver     string
	labels  map[string]bool // containerd: image records carrying the pinned label
	subs    []func(containerd.ImageEvent)
	DropIn  crio.DropIn
	down    bool
	present map[string]bool
	pinned  []string
	matcher *pin.Matcher // pinned, compiled (nil: compile on next use)
	// Registry maps an image to the error its pull returns (nil: pulls fine). An image
	// not in Registry fails with "manifest unknown".
	Registry map[string]error
	// PullDelay slows every pull.
	PullDelay time.Duration
	// Pulls counts pulls per image; Reloads counts reloads.
	Pulls   map[string]int
	Reloads int
	// Auths records the username each pull was given ("" for none).
	Auths map[string]string
	// Concurrent and MaxConcurrent measure pull parallelism.
	Concurrent, MaxConcurrent int
	// pinnedAtPull records, per image, whether the patterns in effect pinned it when
	// its last pull landed (CRI-O).
	pinnedAtPull map[string]bool
	// failReloads makes the next reloads fail; ignoreReloads makes them "succeed" without
	// CRI-O re-reading its config (a reload CRI-O only logs as failed).
	failReloads, ignoreReloads int
}

// FailReloads makes the next n reloads return an error.
func (r *Runtime) FailReloads(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failReloads = n
}

// IgnoreReloads makes the next n reloads succeed without applying the config.
func (r *Runtime) IgnoreReloads(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ignoreReloads = n
}

// New returns a fake CRI-O 1.34.0 reading its config from d.
func New(d crio.DropIn) *Runtime {
	return &Runtime{Name: "cri-o", Ver: "1.34.0", DropIn: d, present: map[string]bool{}, Registry: map[string]error{},
		Pulls: map[string]int{}, Auths: map[string]string{}, labels: map[string]bool{}}
}

// NewContainerd returns a fake containerd 2.2.9: an image is pinned when its record
// carries the pinned label (Labels, SetPinned: containerd.ImageLabels).
func NewContainerd() *Runtime {
	r := New(crio.DropIn{})
	r.Name, r.Ver = "containerd", "v2.2.9"
	return r
}

// Labels implements containerd.ImageLabels: the image record's labels.
func (r *Runtime) Labels(_ context.Context, name string) (map[string]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return nil, errDown
	}
	if !r.present[name] {
		return nil, fmt.Errorf("get image %s: %w", name, containerd.ErrNotFound)
	}
	l := map[string]string{"io.cri-containerd.image": "managed"}
	if r.labels[name] {
		l[containerd.PinnedLabel] = containerd.PinnedLabelValue
	}
	return l, nil
}

// SetPinned implements containerd.ImageLabels.
func (r *Runtime) SetPinned(_ context.Context, name string, pinned bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return errDown
	}
	if !r.present[name] {
		return fmt.Errorf("label image %s: %w", name, containerd.ErrNotFound)
	}
	if pinned {
		r.labels[name] = true
	} else {
		delete(r.labels, name)
	}
	r.emit(containerd.ImageEvent{Name: name, Pinned: pinned})
	return nil
}

// ImageEvents implements containerd.EventSource: image records created, updated
// (labels) and deleted, until ctx ends.
func (r *Runtime) ImageEvents(ctx context.Context, fn func(containerd.ImageEvent)) error {
	r.mu.Lock()
	r.subs = append(r.subs, fn)
	r.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

// emit sends an event to every subscriber; r.mu is held.
func (r *Runtime) emit(e containerd.ImageEvent) {
	for _, fn := range r.subs {
		go fn(e)
	}
}

// PinnedAtPull says whether the pins in effect (CRI-O's patterns) pinned ref when its
// last pull landed.
func (r *Runtime) PinnedAtPull(ref string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pinnedAtPull[ref]
}

// Labeled says whether the image record carries the pinned label (containerd).
func (r *Runtime) Labeled(ref string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.labels[ref]
}

var errDown = fmt.Errorf("connection error: %w", cri.ErrUnavailable)

// SetDown stops or starts the fake runtime. A start re-reads the config, as CRI-O does.
func (r *Runtime) SetDown(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
	if !down {
		r.pinned, r.matcher = r.readPins(), nil
	}
}

// SetRegistry sets what a pull of ref returns (nil: it works), safely while pulls run.
func (r *Runtime) SetRegistry(ref string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Registry[ref] = err
}

// PullCount is how many times ref was pulled.
func (r *Runtime) PullCount(ref string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.Pulls[ref]
}

// AuthUser is the username the last pull of ref was given ("" for none).
func (r *Runtime) AuthUser(ref string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.Auths[ref]
}

// MaxParallel is the most pulls seen at once.
func (r *Runtime) MaxParallel() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.MaxConcurrent
}

// ReloadCount is how many reloads there were.
func (r *Runtime) ReloadCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.Reloads
}

// Remove deletes an image from storage (a wipe), its record and labels with it.
func (r *Runtime) Remove(ref string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.present, ref)
	delete(r.labels, ref)
	r.emit(containerd.ImageEvent{Name: ref, Deleted: true})
}

// ImageNames lists the names of the images in storage (CRI ListImages).
func (r *Runtime) ImageNames(context.Context) (map[string]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return nil, errDown
	}
	names := map[string]string{}
	for ref, ok := range r.present {
		if ok {
			names[ref] = ref // ImageStatus's ID
		}
	}
	return names, nil
}

// Present says whether the image is in storage.
func (r *Runtime) Present(ref string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.present[ref]
}

// Pinned returns the pins in effect.
func (r *Runtime) Pinned() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.pinned...)
}

func (r *Runtime) readPins() []string {
	var eff []string
	for _, f := range r.DropIn.Scan() {
		if f.Err == nil && f.SetsPins {
			eff = f.Pins
		}
	}
	return eff
}

// Version implements CRI Version.
func (r *Runtime) Version(context.Context) (cri.Version, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return cri.Version{}, errDown
	}
	return cri.Version{Name: r.Name, Version: r.Ver}, nil
}

// ImageStatus implements CRI ImageStatus.
func (r *Runtime) ImageStatus(_ context.Context, ref string) (cri.Image, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return cri.Image{}, errDown
	}
	if !r.present[ref] {
		return cri.Image{}, nil
	}
	if r.Name == "containerd" {
		return cri.Image{Present: true, Pinned: r.labels[ref], ID: ref}, nil
	}
	if r.matcher == nil {
		r.matcher = pin.NewMatcher(r.pinned)
	}
	return cri.Image{Present: true, Pinned: r.matcher.Match(ref), ID: ref}, nil
}

// PullImage implements CRI PullImage.
func (r *Runtime) PullImage(ctx context.Context, ref string, auth *pullcreds.Auth) (string, error) {
	r.mu.Lock()
	if r.down {
		r.mu.Unlock()
		return "", errDown
	}
	r.Pulls[ref]++
	if auth != nil {
		r.Auths[ref] = auth.Username
	} else {
		r.Auths[ref] = ""
	}
	r.Concurrent++
	r.MaxConcurrent = max(r.MaxConcurrent, r.Concurrent)
	err, known := r.Registry[ref]
	delay := r.PullDelay
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.Concurrent--
		r.mu.Unlock()
	}()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if !known {
		return "", &cri.PullError{Op: "pull", Message: "reading manifest " + ref[strings.LastIndex(ref, "@")+1:] + ": manifest unknown"}
	}
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return "", errDown
	}
	r.present[ref] = true
	if r.matcher == nil {
		r.matcher = pin.NewMatcher(r.pinned)
	}
	if r.pinnedAtPull == nil {
		r.pinnedAtPull = map[string]bool{}
	}
	r.pinnedAtPull[ref] = r.matcher.Match(ref)
	if r.Name == "containerd" {
		// containerd 2.x's CRI pull stores the record through the transfer service, which
		// replaces its labels: a pull of a pinned reference drops the pinned label.
		delete(r.labels, ref)
		r.emit(containerd.ImageEvent{Name: ref})
	}
	return ref, nil
}

// PinnedImages implements the live config read (GET /config).
func (r *Runtime) PinnedImages(context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return nil, errors.New("dial unix: connection refused")
	}
	return append([]string{}, r.pinned...), nil
}

// Reload re-reads the drop-ins, as CRI-O does on SIGHUP.
func (r *Runtime) Reload(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return errors.New("reload: no process owns the socket")
	}
	r.Reloads++
	if r.failReloads > 0 {
		r.failReloads--
		return errors.New("reload: job failed")
	}
	if r.ignoreReloads > 0 {
		r.ignoreReloads--
		return nil
	}
	r.pinned, r.matcher = r.readPins(), nil
	return nil
}
