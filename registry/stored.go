package registry

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/types"
)

// Store is the node's blob store (package blobstore), read by digest: the manifests
// and blobs the node-local mirror serves pinned images from, filled from registries and
// peers or put there by imagepinctl seed.
type Store interface {
	Reader(ctx context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error)
}

// errNotStored is a manifest the store lacks.
var errNotStored = errors.New("not in the node's store")

// ResolveStored is Resolve from the node's store, without a registry request: image,
// by digest, sized from the manifests store holds (for a list, the instance for the
// node's platform), each layer's uncompressed size read from the layer itself when the
// store holds it. stored is false, and nothing is said, when the image is not by digest
// or the store lacks a manifest it needs: ask its registry (Resolve). A stored
// manifest is the registry's by its digest, so what it says is the verdict: a list
// with no instance for the platform is an *UnavailableError, as from the registry.
func (r *Client) ResolveStored(ctx context.Context, store Store, image string) (img Image, stored bool, err error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return Image{}, false, nil
	}
	canonical, ok := named.(reference.Canonical)
	if !ok {
		return Image{}, false, nil // a tag: what it means now is the registry's to say
	}
	get := func(ctx context.Context, d *digest.Digest) ([]byte, string, error) {
		want := canonical.Digest()
		if d != nil {
			want = *d
		}
		return readStoredManifest(ctx, store, want)
	}
	blob, mime, err := get(ctx, nil)
	if err != nil {
		return Image{}, false, nil
	}
	read := func(ctx context.Context, l types.BlobInfo, off, n uint64) ([]byte, error) {
		rd, size, err := store.Reader(ctx, l.Digest)
		if err != nil {
			return nil, err
		}
		defer rd.Close()
		if size != l.Size || off+n > uint64(size) {
			return nil, fmt.Errorf("stored blob %s: %d bytes, its descriptor says %d", l.Digest, size, l.Size)
		}
		b := make([]byte, n)
		if _, err := rd.Seek(int64(off), io.SeekStart); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	img, infos, err := r.imageOf(ctx, image, blob, mime, get)
	if err == nil {
		// Read from the node's own disk: every layer's size is taken, no decision waits
		// for it.
		img = r.sizeLayers(ctx, func(ctx context.Context, l types.BlobInfo) (int64, string) {
			if r.cfg.NoUncompressedSizes {
				return 0, ""
			}
			size, from, _ := uncompressedSize(ctx, read, l)
			return size, from
		}, img, infos)
	}
	if errors.Is(err, errNotStored) {
		return Image{}, false, nil // the list is stored, not its instance for this platform
	}
	return img, true, r.failed(image, err)
}

// readStoredManifest is the manifest d from store, checked against d, with the media
// type it gives or its shape says (the store keeps bytes only); errNotStored when the
// store lacks it or holds something else.
func readStoredManifest(ctx context.Context, store Store, d digest.Digest) ([]byte, string, error) {
	rd, size, err := store.Reader(ctx, d)
	if err != nil {
		return nil, "", fmt.Errorf("manifest %s: %w", d, errNotStored)
	}
	defer rd.Close()
	const maxManifest = 4 << 20 // the distribution spec's limit
	if size > maxManifest {
		return nil, "", fmt.Errorf("manifest %s: %d bytes: %w", d, size, errNotStored)
	}
	blob, err := io.ReadAll(io.LimitReader(rd, maxManifest))
	if err != nil || !d.Algorithm().Available() || d.Algorithm().FromBytes(blob) != d {
		return nil, "", fmt.Errorf("manifest %s: %w", d, errNotStored)
	}
	mime := manifest.GuessMIMEType(blob)
	if mime == "" {
		return nil, "", fmt.Errorf("manifest %s: not a manifest: %w", d, errNotStored)
	}
	return blob, mime, nil
}
