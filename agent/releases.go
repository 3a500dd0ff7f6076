package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/imagepin/imagepin/conf"
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
}

const expandTimeout = 2 * time.Minute

// expandReleases adds to each set with spec.releaseImage the images its release needs on
// this node (its role, its OS stream). A release that cannot be read keeps the images
// of its last good expansion, so a registry outage unpins nothing.
func (a *Agent) expandReleases(ctx context.Context, desired []conf.Set) []conf.Set {
	if a.releases == nil {
		a.releases = map[string]releaseState{}
	}
	now := a.deps.Clock.Now()
	failed := false
	for i, s := range desired {
		if s.ReleaseImage == "" {
			delete(a.releases, s.Name)
			continue
		}
		prev, had := a.releases[s.Name]
		if had && (prev.pullSpec != s.ReleaseImage || prev.stream != s.OSImageStream) {
			prev, had = releaseState{}, false
		}
		st := releaseState{pullSpec: s.ReleaseImage, stream: s.OSImageStream}
		if had && prev.err == nil && prev.labels == labelString(a.labels) {
			st = prev // expanded for these labels already
		} else if had && prev.err != nil && !a.releaseRetry.due(now) {
			st = prev
		} else {
			st = a.expand(ctx, s)
			st.labels = labelString(a.labels)
			if st.err != nil {
				a.log.WithField("set", s.Name).WithError(st.err).Warn("release not expanded")
				if had && len(prev.images) > 0 {
					st.images, st.version = prev.images, prev.version
				}
			} else if !had || !slices.Equal(prev.images, st.images) {
				a.log.WithField("set", s.Name).WithField("release", st.version).WithField("images", len(st.images)).Info("release expanded")
			}
		}
		if st.err != nil {
			failed = true
		}
		a.releases[s.Name] = st
		images := slices.Clone(s.Images)
		for _, img := range st.images {
			if !slices.Contains(images, img) {
				images = append(images, img)
			}
		}
		desired[i].Images = images
	}
	if failed {
		if a.releaseRetry.due(now) {
			a.releaseRetry.fail(now, a.cfg.MaxBackoff, a.rand)
		}
	} else {
		a.releaseRetry.reset()
	}
	return desired
}

func (a *Agent) expand(ctx context.Context, s conf.Set) releaseState {
	st := releaseState{pullSpec: s.ReleaseImage, stream: s.OSImageStream}
	if a.deps.Releases == nil {
		st.err, st.permanent = errors.New("this imagepind cannot expand releases"), true
		return st
	}
	ectx, cancel := context.WithTimeout(ctx, expandTimeout)
	defer cancel()
	rel, err := a.deps.Releases.Expand(ectx, s.ReleaseImage)
	if err != nil {
		st.err = err
		st.permanent = errors.Is(err, release.ErrNotRelease)
		return st
	}
	st.version = rel.Version
	images, err := rel.Images(release.IsControlPlane(a.labels), s.OSImageStream)
	if err != nil {
		st.err, st.permanent = err, true
		return st
	}
	st.images = images
	return st
}

// releaseStatus is the set's status.release.
func (a *Agent) releaseStatus(s conf.Set) *status.Release {
	st, ok := a.releases[s.Name]
	if !ok {
		return nil
	}
	r := &status.Release{Image: st.pullSpec, Version: st.version, Images: len(st.images)}
	if st.err != nil {
		r.Error = st.err.Error()
	}
	return r
}

// releaseProblem is the set's phase override when its release could not be expanded.
func (a *Agent) releaseProblem(s conf.Set) (status.Phase, string, string, bool) {
	st, ok := a.releases[s.Name]
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
