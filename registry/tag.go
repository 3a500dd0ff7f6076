package registry

import (
	"context"
	"fmt"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/types"
)

// Tag is what a tag names at its registry.
type Tag struct {
	// Digest is the manifest's: a list's (an OCI index's) when the tag names one.
	Digest digest.Digest
	// List says the tag names a manifest list or OCI index; Platforms are its entries
	// (ListPlatforms; none when the list does not parse).
	List      bool
	Platforms []string
}

// ResolveTag asks which manifest image's tag names (no tag: :latest), the way the runtime
// would pull it: through the mirrors of registries.conf, certs.d and the kubelet's
// credentials. image is a fully qualified reference; errors name it as written. The
// answer comes within Config.Timeout, and errors are *UnavailableError when retrying
// cannot help. Tags move: nothing is cached.
func (r *Client) ResolveTag(ctx context.Context, image string) (Tag, error) {
	named, err := reference.ParseNamed(image)
	if err != nil {
		return Tag{}, r.failed(image, fmt.Errorf("%s: %w", image, err))
	}
	ref, err := docker.NewReference(reference.TagNameOnly(named))
	if err != nil {
		return Tag{}, r.failed(image, fmt.Errorf("%s: %w", image, err))
	}
	var t Tag
	err = r.bounded(ctx, image, func(ctx context.Context) error {
		var err error
		t, err = r.readTag(ctx, ref, image)
		return err
	})
	return t, err
}

func (r *Client) readTag(ctx context.Context, ref types.ImageReference, image string) (Tag, error) {
	src, err := ref.NewImageSource(ctx, r.SystemContext(image))
	if err != nil {
		return Tag{}, err
	}
	defer src.Close()
	blob, mime, err := src.GetManifest(ctx, nil)
	if err != nil {
		return Tag{}, fmt.Errorf("read manifest of %s: %w", image, err)
	}
	d, err := manifest.Digest(blob)
	if err != nil {
		return Tag{}, fmt.Errorf("digest of %s's manifest: %w", image, err)
	}
	t := Tag{Digest: d}
	if manifest.MIMETypeIsMultiImage(mime) {
		t.List = true
		if list, err := manifest.ListFromBlob(blob, mime); err == nil {
			t.Platforms = ListPlatforms(list)
		}
	}
	return t, nil
}
