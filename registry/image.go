package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/pkg/blobinfocache/none"
	"go.podman.io/image/v5/types"

	"github.com/imagepin/imagepin/failure"
)

// Descriptor names one blob of an image: its digest and size (-1: unknown).
type Descriptor struct {
	Digest digest.Digest
	Size   int64
}

// Manifest is an image's manifest for the platform: its config blob and its layers, in
// the manifest's order.
type Manifest struct {
	Config Descriptor
	Layers []Descriptor
}

// ImageReader is one image opened at the endpoint that answered for it (a mirror in
// registries.conf order, or the image's own registry), its manifests and blobs read
// through that endpoint. Close it.
type ImageReader struct {
	c     *Client
	image string
	src   types.ImageSource
	sys   *types.SystemContext
}

// OpenImage opens image (by digest or tag) as the runtime would reach it: mirrors, certs.d,
// the kubelet's credentials. Each request that waits for a registry (this one, Manifest,
// the start of a Blob) gets an answer within Config.Timeout or fails saying so; errors
// are *UnavailableError when retrying cannot help (failure.Classify), with the text
// containers/image gave.
func (r *Client) OpenImage(ctx context.Context, image string) (*ImageReader, error) {
	ref, err := docker.ParseReference("//" + image)
	if err != nil {
		return nil, r.failed(image, err)
	}
	sys := r.SystemContext(image)
	var src types.ImageSource
	err = r.bounded(ctx, image, func(ctx context.Context) error {
		// NewImageSource tries the mirrors in registries.conf order, then the source, as
		// CRI-O does; its error names every endpoint tried.
		src, err = ref.NewImageSource(ctx, sys)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &ImageReader{c: r, image: image, src: src, sys: sys}, nil
}

// Close ends the reader's connection.
func (o *ImageReader) Close() error { return o.src.Close() }

// Manifest is the image's manifest for the Client's platform: a list's (an index's)
// instance for it. A layer claiming more than MaxLayerSize is an error.
func (o *ImageReader) Manifest(ctx context.Context) (Manifest, error) {
	var m manifest.Manifest
	err := o.c.bounded(ctx, o.image, func(ctx context.Context) error {
		blob, mime, err := o.src.GetManifest(ctx, nil)
		if err != nil {
			return err
		}
		if manifest.MIMETypeIsMultiImage(mime) {
			list, err := manifest.ListFromBlob(blob, mime)
			if err != nil {
				return err
			}
			d, err := list.ChooseInstance(o.sys)
			if err != nil {
				return err
			}
			if blob, mime, err = o.src.GetManifest(ctx, &d); err != nil {
				return err
			}
		}
		m, err = manifest.FromBlob(blob, manifest.NormalizedMIMEType(mime))
		return err
	})
	if err != nil {
		return Manifest{}, err
	}
	cfg := m.ConfigInfo()
	out := Manifest{Config: Descriptor{Digest: cfg.Digest, Size: cfg.Size}}
	for _, l := range m.LayerInfos() {
		if l.Size > MaxLayerSize {
			return Manifest{}, o.c.failed(o.image, fmt.Errorf("manifest of %s: layer %s claims %d bytes, more than the 1 TiB a layer can plausibly have", o.image, l.Digest, l.Size))
		}
		out.Layers = append(out.Layers, Descriptor{Digest: l.Digest, Size: l.Size})
	}
	return out, nil
}

// Blob streams blob d of the image. Its first answer comes within Config.Timeout; the
// body then runs as long as ctx does, and ends in an error past d.Size bytes (past
// MaxLayerSize when the size is unknown).
func (o *ImageReader) Blob(ctx context.Context, d Descriptor) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(o.c.cfg.Timeout, cancel)
	rc, _, err := o.src.GetBlob(ctx, types.BlobInfo{Digest: d.Digest, Size: d.Size}, none.NoCache)
	late := !timer.Stop()
	if err != nil {
		cancel()
		if late {
			err = fmt.Errorf("%s: no answer from its registry within %s: %w", o.image, o.c.cfg.Timeout, err)
		}
		return nil, o.c.failed(o.image, err)
	}
	if late { // the answer came as the deadline cut it
		rc.Close()
		cancel()
		return nil, fmt.Errorf("%s: no answer from its registry within %s: %w", o.image, o.c.cfg.Timeout, context.DeadlineExceeded)
	}
	limit := d.Size
	if limit <= 0 || limit > MaxLayerSize {
		limit = MaxLayerSize
	}
	return &boundedBody{rc: rc, cancel: cancel, left: limit, d: d.Digest}, nil
}

// errBlobTooLong is a blob whose body runs past its size.
var errBlobTooLong = errors.New("more bytes than its size")

// boundedBody is a blob's body that fails past its bound, and ends its request on Close.
type boundedBody struct {
	rc     io.ReadCloser
	cancel context.CancelFunc
	left   int64
	d      digest.Digest
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more than the bound tells a long body from one that ends there.
		var one [1]byte
		if n, err := b.rc.Read(one[:]); n > 0 {
			return 0, fmt.Errorf("blob %s: %w", b.d, errBlobTooLong)
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedBody) Close() error {
	err := b.rc.Close()
	b.cancel()
	return err
}

// bounded runs step, which waits for a registry, within Config.Timeout; its error goes
// through failed.
func (r *Client) bounded(ctx context.Context, image string, step func(context.Context) error) error {
	sctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	err := step(sctx)
	if err != nil && sctx.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("%s: no answer from its registry within %s: %w", image, r.cfg.Timeout, err)
	}
	return r.failed(image, err)
}

// failed is how every error of the Client leaves it: *UnavailableError when retrying
// cannot help (failure.Classify), else as it is; its text is kept.
func (r *Client) failed(image string, err error) error {
	if err == nil {
		return nil
	}
	if failure.Classify(err) == failure.Unavailable {
		return &UnavailableError{Image: image, Err: err}
	}
	return err
}
