package keep

import (
	"context"
	"fmt"
	"time"

	"github.com/imagepin/imagepin/cri"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/pullcreds"
)

// ImageService is the part of CRI the pulls need.
type ImageService interface {
	ImageStatus(ctx context.Context, ref string) (cri.Image, error)
	PullImage(ctx context.Context, ref string, auth *pullcreds.Auth) (string, error)
}

// Pulls makes CRI-O know a pinned tag the one way CRI-O records a tag: a pull of
// repo:tag. CRI-O's registries drop-in asks the node-local mirror's TLS endpoint for
// tags first (crio.MirrorRegistries), which answers a pinned tag with its pinned digest
// (mirror.WithTags); the image is on the node already, so the pull moves no layer and
// only adds the name. No credentials go with the pull: the mirror needs none, and
// should the mirror not answer, the pull must not take the tag from the registry.
type Pulls struct {
	CRI ImageService
	// Timeout bounds one pull (0: 5 minutes).
	Timeout time.Duration
}

// Ensure pulls t.Name when CRI-O does not hold it as t.Image's image; held false while
// t.Image is not on the node. A pull that gives another image (the tag came from a
// registry where it moved) is an error: the next pass pulls again.
func (p *Pulls) Ensure(ctx context.Context, t pinset.Tag) (bool, error) {
	img, err := p.CRI.ImageStatus(ctx, t.Image)
	if err != nil {
		return false, err
	}
	if !img.Present {
		return false, nil
	}
	cur, err := p.CRI.ImageStatus(ctx, t.Name)
	if err != nil {
		return false, err
	}
	if cur.Present && cur.ID == img.ID {
		return true, nil
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := p.CRI.PullImage(pctx, t.Name, nil); err != nil {
		return false, fmt.Errorf("pull %s through the node-local mirror: %w", t.Name, err)
	}
	if cur, err = p.CRI.ImageStatus(ctx, t.Name); err != nil {
		return false, err
	}
	if cur.ID != img.ID {
		return false, fmt.Errorf("the pull of %s gave image %s, not %s's %s: the tag did not come from the node-local mirror", t.Name, cur.ID, t.Image, img.ID)
	}
	return true, nil
}

// Forget does nothing: a name CRI-O holds keeps nothing the pins do not.
func (p *Pulls) Forget(context.Context, []pinset.Tag) error { return nil }
