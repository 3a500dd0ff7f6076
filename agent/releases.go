package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/release"
	"github.com/imagepin/imagepin/status"
)

// releaseState is what a set's release expanded to, or why it did not.
type releaseState struct {
	pullSpec, stream string
	labels           string // the node labels it was expanded for
	version          string
	images           []string
	err              error
	permanent        bool
	// pending: never expanded yet, an expansion is running.
	pending bool
}

// expandTimeout bounds one expansion; it runs off the loop.
const expandTimeout = 2 * time.Minute

// expandReleases adds to each set with spec.releaseImage the images its release needs on
// this node (its role, its OS stream). Expansion runs off the loop; until it answers, and
// when a release cannot be read, a set keeps the images of its last good expansion, so
// neither a slow registry nor an outage unpins anything.
func (a *Agent) expandReleases(desired []pinset.Set) []pinset.Set {
	if a.rel.releases == nil {
		a.rel.releases = map[string]releaseState{}
		a.rel.expanding = map[string]bool{}
	}
	now := a.deps.Clock.Now()
	failed := false
	for i, s := range desired {
		if s.ReleaseImage == "" {
			delete(a.rel.releases, s.Name)
			continue
		}
		prev, had := a.rel.releases[s.Name]
		if had && (prev.pullSpec != s.ReleaseImage || prev.stream != s.OSImageStream) {
			prev, had = releaseState{}, false
		}
		st := prev
		if !had {
			st = releaseState{pullSpec: s.ReleaseImage, stream: s.OSImageStream, pending: true}
		}
		switch {
		case had && prev.err == nil && !prev.pending && prev.labels == labelString(a.in.labels):
			// expanded for these labels already
		case a.rel.expanding[s.Name]:
		case had && prev.err != nil && !a.rel.retry.due(now):
		default:
			a.startExpand(s)
		}
		if st.err != nil {
			failed = true
		}
		a.rel.releases[s.Name] = st
		desired[i].Images = release.Merge(s.Images, st.images)
	}
	if failed {
		if a.rel.retry.due(now) {
			a.rel.retry.fail(now, a.cfg.MaxBackoff, a.rand)
		}
	} else {
		a.rel.retry.reset()
	}
	return desired
}

// startExpand expands s's release for the current labels off the loop.
func (a *Agent) startExpand(s pinset.Set) {
	a.rel.expanding[s.Name] = true
	labels := maps.Clone(a.in.labels)
	a.background(expandTimeout, func(ctx context.Context) func() {
		st := a.expand(ctx, s, labels)
		return func() { a.releaseExpanded(s.Name, st) }
	})
}

// releaseExpanded takes an expansion's answer, on the loop. One for a spec the set no
// longer has is dropped; a failure keeps the last good images.
func (a *Agent) releaseExpanded(name string, st releaseState) {
	delete(a.rel.expanding, name)
	prev, had := a.rel.releases[name]
	if !had || prev.pullSpec != st.pullSpec || prev.stream != st.stream {
		return
	}
	if st.err != nil {
		a.log.WithField("set", name).WithError(st.err).Warn("release not expanded")
		if len(prev.images) > 0 {
			st.images, st.version = prev.images, prev.version
		}
	} else if prev.pending || !slices.Equal(prev.images, st.images) {
		a.log.WithField("set", name).WithField("release", st.version).WithField("images", len(st.images)).Info("release expanded")
	}
	a.rel.releases[name] = st
}

func (a *Agent) expand(ctx context.Context, s pinset.Set, labels map[string]string) releaseState {
	st := releaseState{pullSpec: s.ReleaseImage, stream: s.OSImageStream, labels: labelString(labels)}
	if a.deps.Releases == nil {
		st.err, st.permanent = errors.New("this imagepind cannot expand releases"), true
		return st
	}
	rel, err := a.deps.Releases.Expand(ctx, s.ReleaseImage)
	if err != nil {
		st.err = err
		st.permanent = errors.Is(err, release.ErrNotRelease)
		return st
	}
	st.version = rel.Version
	images, err := rel.ForNode(labels, s.OSImageStream)
	if err != nil {
		st.err, st.permanent = err, true
		return st
	}
	st.images = images
	return st
}

// status is the set's status.release.
func (r *releaseParts) status(s pinset.Set) *status.Release {
	st, ok := r.releases[s.Name]
	if !ok {
		return nil
	}
	out := &status.Release{Image: st.pullSpec, Version: st.version, Images: len(st.images)}
	if st.err != nil {
		out.Error = st.err.Error()
	}
	return out
}

// problem is the set's phase override when its release could not be expanded.
func (r *releaseParts) problem(s pinset.Set) (status.Phase, string, string, bool) {
	st, ok := r.releases[s.Name]
	if ok && st.pending && len(st.images) == 0 {
		return status.Pending, status.ReasonExpandingRelease, fmt.Sprintf("reading release %s from its registry", st.pullSpec), true
	}
	if !ok || st.err == nil {
		return "", "", "", false
	}
	msg := fmt.Sprintf("release %s: %v", st.pullSpec, st.err)
	if st.permanent {
		return status.Failed, status.ReasonInvalidSpec, msg, true
	}
	if len(st.images) > 0 {
		return "", "", "", false // keeps pulling its last good expansion
	}
	return status.Pending, status.ReasonPullRetrying, msg + " (retrying)", true
}
