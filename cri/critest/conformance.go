// Package critest is the conformance suite for what imagepind expects of CRI-O: it runs
// against cri/fakecri in the unit tier and against a real CRI-O in the end-to-end tier,
// so the fake cannot drift from the real thing unnoticed.
package critest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/crio"
)

// Runtime is the CRI surface imagepind uses.
type Runtime interface {
	Version(ctx context.Context) (cri.Version, error)
	ImageStatus(ctx context.Context, ref string) (cri.Image, error)
	PullImage(ctx context.Context, ref string, auth *cri.Auth) (string, error)
}

// Subject is one CRI-O (real or fake) to check, with images to use.
type Subject struct {
	Runtime Runtime
	Live    interface {
		PinnedImages(context.Context) ([]string, error)
	}
	Reloader interface{ Reload(context.Context) error }
	DropIn   crio.DropIn
	// Available are two distinct images the registry has; Missing one it does not.
	Available [2]string
	Missing   string
}

// Run runs the suite; newSubject gives each subtest a fresh runtime.
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	t.Run("Version", func(t *testing.T) {
		s := newSubject(t)
		v, err := s.Runtime.Version(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		sup, err := crio.SupportOf(v.Version)
		if v.Name != "cri-o" || err != nil || !sup.PinnedField {
			t.Fatalf("version %+v (%v): want cri-o ≥ 1.31", v, err)
		}
	})
	t.Run("AbsentImageIsNotAnError", func(t *testing.T) {
		s := newSubject(t)
		img, err := s.Runtime.ImageStatus(t.Context(), s.Available[0])
		if err != nil || img.Present {
			t.Fatalf("%+v %v", img, err)
		}
	})
	t.Run("PullThenPinThenUnpin", func(t *testing.T) {
		s := newSubject(t)
		ctx := t.Context()
		for _, ref := range s.Available {
			if _, err := s.Runtime.PullImage(ctx, ref, nil); err != nil {
				t.Fatalf("pull %s: %v", ref, err)
			}
			if img, err := s.Runtime.ImageStatus(ctx, ref); err != nil || !img.Present || img.Pinned {
				t.Fatalf("after pull %s: %+v %v; want present, not pinned", ref, img, err)
			}
		}
		pinned, other := s.Available[0], s.Available[1]
		if _, err := s.DropIn.Apply([]string{pinned}); err != nil {
			t.Fatal(err)
		}
		if err := s.Reloader.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, "pin in /config and ImageStatus", func() bool {
			live, err := s.Live.PinnedImages(ctx)
			a, _ := s.Runtime.ImageStatus(ctx, pinned)
			b, _ := s.Runtime.ImageStatus(ctx, other)
			return err == nil && slices.Contains(live, pinned) && a.Pinned && !b.Pinned
		})
		if _, err := s.DropIn.Apply(nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Reloader.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, "unpinned", func() bool {
			live, err := s.Live.PinnedImages(ctx)
			a, _ := s.Runtime.ImageStatus(ctx, pinned)
			return err == nil && !slices.Contains(live, pinned) && a.Present && !a.Pinned
		})
	})
	t.Run("MissingManifestIsUnavailable", func(t *testing.T) {
		s := newSubject(t)
		_, err := s.Runtime.PullImage(t.Context(), s.Missing, nil)
		if err == nil {
			t.Fatal("pull of a missing image succeeded")
		}
		if got := cri.Classify(err); got != cri.Unavailable {
			t.Fatalf("Classify(%q) = %v, want Unavailable", err, got)
		}
	})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
