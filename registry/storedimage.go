package registry

import (
	"context"
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/types"
)

// StoreFirst opens an image by digest from the node's store when the store holds its
// manifest (seeded, or kept for a pinned image), with no registry request, and any other
// image through Client as OpenImage does. Release expansion reads a seeded release image
// this way on a node that has no registry at all. A nil Store opens everything through
// Client.
type StoreFirst struct {
	Client *Client
	Store  Store
}

// OpenImage opens image from the store when it is by digest and stored, else from its
// registry.
func (s StoreFirst) OpenImage(ctx context.Context, image string) (*ImageReader, error) {
	if s.Store != nil {
		if o, ok := s.Client.OpenStored(ctx, s.Store, image); ok {
			return o, nil
		}
	}
	return s.Client.OpenImage(ctx, image)
}

// OpenStored opens image from store: ok is false when image is not by digest or store
// lacks its manifest (a list's instances are read as they are asked for: one the store
// lacks fails then). Blobs are read from store; the store checked each one's digest as
// it took it in.
func (r *Client) OpenStored(ctx context.Context, store Store, image string) (*ImageReader, bool) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return nil, false
	}
	canonical, ok := named.(reference.Canonical)
	if !ok {
		return nil, false
	}
	top, mime, err := readStoredManifest(ctx, store, canonical.Digest())
	if err != nil {
		return nil, false
	}
	ref, err := docker.NewReference(canonical)
	if err != nil {
		return nil, false
	}
	src := &storedSource{ref: ref, store: store, top: top, topMIME: mime}
	return &ImageReader{c: r, image: image, src: src, sys: r.SystemContext(image)}, true
}

// storedSource is a types.ImageSource over the node's store, for one image by digest.
type storedSource struct {
	ref   types.ImageReference
	store Store
	// top is the image's own manifest (or index), read and checked when it was opened.
	top     []byte
	topMIME string
}

func (s *storedSource) Reference() types.ImageReference { return s.ref }
func (s *storedSource) Close() error                    { return nil }
func (s *storedSource) HasThreadSafeGetBlob() bool      { return true }

func (s *storedSource) GetManifest(ctx context.Context, instance *digest.Digest) ([]byte, string, error) {
	if instance == nil {
		return s.top, s.topMIME, nil
	}
	blob, mime, err := readStoredManifest(ctx, s.store, *instance)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", s.ref.DockerReference(), err)
	}
	return blob, mime, nil
}

func (s *storedSource) GetBlob(ctx context.Context, info types.BlobInfo, _ types.BlobInfoCache) (io.ReadCloser, int64, error) {
	rd, size, err := s.store.Reader(ctx, info.Digest)
	if err != nil {
		return nil, 0, fmt.Errorf("blob %s of %s: %w", info.Digest, s.ref.DockerReference(), errNotStored)
	}
	if info.Size >= 0 && size != info.Size {
		rd.Close()
		return nil, 0, fmt.Errorf("stored blob %s: %d bytes, its descriptor says %d", info.Digest, size, info.Size)
	}
	return rd, size, nil
}

func (s *storedSource) GetSignatures(context.Context, *digest.Digest) ([][]byte, error) {
	return nil, nil
}

func (s *storedSource) LayerInfosForCopy(context.Context, *digest.Digest) ([]types.BlobInfo, error) {
	return nil, nil
}
