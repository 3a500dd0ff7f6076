// Package pintest is the conformance suite of the runtime port (pin.Pinner) and of the
// CRI calls imagepind makes: it runs against test/fakeruntime (as CRI-O and as
// containerd) in the unit tier and against real CRI-O and real containerd in the
// end-to-end tier, so the fakes cannot drift from the real things unnoticed.
package pintest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/failure"
	"github.com/imagepin/imagepin/pin"
)

// Runtime is the CRI surface imagepind uses (cri.ImageService).
type Runtime = cri.ImageService

// Subject is one runtime (real or fake) to check, with images to use.
type Subject struct {
	// Name is the runtime's CRI name ("cri-o", "containerd").
	Name    string
	Runtime Runtime
	Pinner  pin.Pinner
	// PinByHand pins ref the way an administrator would without imagepind (CRI-O: a
	// drop-in of their own; containerd: the label set with ctr).
	PinByHand func(ctx context.Context, ref string) error
	// RepullUnpins says that a CRI pull of a pinned reference takes its pin away:
	// containerd 2.x (its CRI plugin stores the pulled record through the transfer
	// service, which replaces the record's labels); CRI-O's patterns stay.
	RepullUnpins bool
	// PullReturnsRepoDigest says that CRI PullImage returns a repository digest, not the
	// image ID: CRI-O before 1.36. (The kubelet keys the record of its own pull by what
	// PullImage returns and looks it up by the image ID.)
	PullReturnsRepoDigest bool
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
		sup, err := s.Pinner.Support(v.Version)
		if v.Name != s.Name || err != nil || !sup.PinnedField || !sup.WithoutRestart || sup.Problem != "" {
			t.Fatalf("version %+v: support %+v (%v): want %s that pins without a restart and reports Image.pinned", v, sup, err, s.Name)
		}
	})
	// imagepind's cheap presence check: ListImages names every pulled image by the
	// reference it was pulled by (by digest), so an image removed behind imagepind's back
	// is seen missing by one call.
	t.Run("ImageNamesListPulledReferences", func(t *testing.T) {
		s := newSubject(t)
		ctx := t.Context()
		ref := s.Available[0]
		if names, err := s.Runtime.ImageNames(ctx); err != nil || names[ref] != "" {
			t.Fatalf("before the pull: %q %v", names[ref], err)
		}
		if _, err := s.Runtime.PullImage(ctx, ref, nil); err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		names, err := s.Runtime.ImageNames(ctx)
		if err != nil || names[ref] == "" {
			t.Fatalf("after pulling %s the runtime lists %v (%v)", ref, names, err)
		}
		// The ID is ImageStatus's: the kubelet's pull records are keyed by it.
		if img, err := s.Runtime.ImageStatus(ctx, ref); err != nil || img.ID != names[ref] {
			t.Fatalf("ListImages says %s is %q, ImageStatus %q (%v)", ref, names[ref], img.ID, err)
		}
	})
	// What PullImage returns is the key of the kubelet's record of its own pull, which it
	// looks up by ImageStatus's ID: the image ID on containerd and CRI-O 1.36, a
	// repository digest on CRI-O before 1.36.
	t.Run("PullImageReturns", func(t *testing.T) {
		s := newSubject(t)
		ctx := t.Context()
		ref := s.Available[0]
		got, err := s.Runtime.PullImage(ctx, ref, nil)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		img, err := s.Runtime.ImageStatus(ctx, ref)
		if err != nil || !img.Present {
			t.Fatalf("after the pull: %+v %v", img, err)
		}
		repo, _, _ := strings.Cut(ref, "@")
		switch {
		case s.PullReturnsRepoDigest && (got == img.ID || !strings.HasPrefix(got, repo+"@sha256:")):
			t.Fatalf("PullImage(%s) returned %q, want a repository digest (the image ID is %q)", ref, got, img.ID)
		case !s.PullReturnsRepoDigest && got != img.ID:
			t.Fatalf("PullImage(%s) returned %q, want the image ID %q", ref, got, img.ID)
		}
		t.Logf("%s: PullImage returned %q, ImageStatus's ID %q", s.Name, got, img.ID)
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
		apply(t, s, []string{pinned}, onNode)
		eventually(t, "pinned in effect and in ImageStatus", func() bool {
			a, _ := s.Runtime.ImageStatus(ctx, pinned)
			b, _ := s.Runtime.ImageStatus(ctx, other)
			return inEffect(s, []string{pinned}) && a.Pinned && !b.Pinned
		})
		apply(t, s, nil, onNode)
		eventually(t, "unpinned", func() bool {
			a, _ := s.Runtime.ImageStatus(ctx, pinned)
			return inEffect(s, nil) && a.Present && !a.Pinned
		})
	})
	// The order imagepind uses for a missing image: pins first, then the pull (CRI-O's
	// pattern pins it as it lands; containerd's record is labelled by Pulled).
	t.Run("PinThenPull", func(t *testing.T) {
		s := newSubject(t)
		ctx := t.Context()
		ref := s.Available[0]
		apply(t, s, []string{ref}, absent)
		if _, err := s.Runtime.PullImage(ctx, ref, nil); err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if _, err := s.Pinner.Pulled(ctx, ref); err != nil {
			t.Fatal(err)
		}
		eventually(t, "pinned once pulled", func() bool {
			img, _ := s.Runtime.ImageStatus(ctx, ref)
			return img.Present && img.Pinned
		})
	})
	// The kubelet pulls what a pod needs whether or not it is there (imagePullPolicy:
	// Always): on CRI-O the pin stays; containerd 2.x drops the label, which imagepind
	// puts back when the image event arrives.
	t.Run("Repull", func(t *testing.T) {
		s := newSubject(t)
		ctx := t.Context()
		ref := s.Available[0]
		if _, err := s.Runtime.PullImage(ctx, ref, nil); err != nil {
			t.Fatal(err)
		}
		apply(t, s, []string{ref}, onNode)
		eventually(t, "pinned", func() bool { img, _ := s.Runtime.ImageStatus(ctx, ref); return img.Pinned })
		if _, err := s.Runtime.PullImage(ctx, ref, nil); err != nil {
			t.Fatal(err)
		}
		if s.RepullUnpins {
			eventually(t, "the pin dropped by the pull", func() bool { img, _ := s.Runtime.ImageStatus(ctx, ref); return img.Present && !img.Pinned })
			return
		}
		for i := 0; i < 10; i++ {
			if img, err := s.Runtime.ImageStatus(ctx, ref); err != nil || !img.Pinned {
				t.Fatalf("after a second pull: %+v %v; the pin is gone", img, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	// A pin somebody else made stays when imagepind's own pins go.
	t.Run("OthersPinsStay", func(t *testing.T) {
		s := newSubject(t)
		ctx := t.Context()
		mine, theirs := s.Available[0], s.Available[1]
		for _, ref := range s.Available {
			if _, err := s.Runtime.PullImage(ctx, ref, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.PinByHand(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		apply(t, s, []string{mine, theirs}, onNode)
		eventually(t, "both pinned", func() bool {
			a, _ := s.Runtime.ImageStatus(ctx, mine)
			b, _ := s.Runtime.ImageStatus(ctx, theirs)
			return a.Pinned && b.Pinned
		})
		apply(t, s, nil, onNode)
		eventually(t, "ours unpinned, theirs kept", func() bool {
			a, _ := s.Runtime.ImageStatus(ctx, mine)
			b, _ := s.Runtime.ImageStatus(ctx, theirs)
			return !a.Pinned && b.Pinned
		})
	})
	t.Run("MissingManifestIsUnavailable", func(t *testing.T) {
		s := newSubject(t)
		_, err := s.Runtime.PullImage(t.Context(), s.Missing, nil)
		if err == nil {
			t.Fatal("pull of a missing image succeeded")
		}
		if got := failure.Classify(err); got != failure.Unavailable {
			t.Fatalf("Classify(%q) = %v, want Unavailable", err, got)
		}
	})
}

func onNode(string) (bool, bool) { return true, false }
func absent(string) (bool, bool) { return false, false }

// apply writes and applies patterns as the agent does.
func apply(t *testing.T, s Subject, patterns []string, images func(string) (bool, bool)) {
	t.Helper()
	if _, err := s.Pinner.Write(t.Context(), patterns, images); err != nil {
		t.Fatal(err)
	}
	if err := s.Pinner.Apply(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// inEffect says whether the runtime shows the pins written, with the runtime's own
// patterns (CRI-O's other files) beside ours: the suite's subjects have none.
func inEffect(s Subject, patterns []string) bool {
	ok, err := s.Pinner.InEffect(context.Background(), patterns)
	return ok && err == nil
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
