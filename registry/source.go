package registry

import (
	"context"
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/blobinfocache/none"
	"go.podman.io/image/v5/types"
)

// Manifest fetches the manifest repo@d as the runtime would (mirrors, certs, the
// pull secret), with its media type. It is what the node-local mirror (package mirror)
// falls back on; the Client it is called on must read registries.conf without the
// mirror's own drop-in, or the mirror would ask itself.
func (r *Client) Manifest(ctx context.Context, repo string, d digest.Digest) ([]byte, string, error) {
	src, err := r.source(ctx, repo, d)
	if err != nil {
		return nil, "", err
	}
	defer src.Close()
	return src.GetManifest(ctx, nil)
}

// Blob streams blob d of repo, named by the manifest repo@manifest (containers/image
// picks its endpoint by that manifest), and says its size (-1: unknown).
func (r *Client) Blob(ctx context.Context, repo string, manifest, d digest.Digest) (io.ReadCloser, int64, error) {
	src, err := r.source(ctx, repo, manifest)
	if err != nil {
		return nil, 0, err
	}
	rc, size, err := src.GetBlob(ctx, types.BlobInfo{Digest: d, Size: -1}, none.NoCache)
	if err != nil {
		src.Close()
		return nil, 0, err
	}
	return &closeBoth{ReadCloser: rc, src: src}, size, nil
}

func (r *Client) source(ctx context.Context, repo string, d digest.Digest) (types.ImageSource, error) {
	named, err := reference.ParseNormalizedNamed(repo)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", repo, err)
	}
	canonical, err := reference.WithDigest(named, d)
	if err != nil {
		return nil, err
	}
	ref, err := docker.NewReference(canonical)
	if err != nil {
		return nil, err
	}
	return ref.NewImageSource(ctx, r.SystemContext(canonical.String()))
}

type closeBoth struct {
	io.ReadCloser
	src types.ImageSource
}

func (c *closeBoth) Close() error {
	err := c.ReadCloser.Close()
	c.src.Close()
	return err
}
