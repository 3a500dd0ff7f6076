package env

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Tag points repo:tag at a pushed image in the registry (as `crane tag` does): images a
// Deployment names by tag.
func (r *Registry) Tag(ctx context.Context, img Image, tag string) error {
	src, err := name.ParseReference(img.Ref(), name.Insecure)
	if err != nil {
		return err
	}
	opts := []remote.Option{remote.WithContext(ctx)}
	if r.User != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}))
	}
	desc, err := remote.Get(src, opts...)
	if err != nil {
		return fmt.Errorf("get %s: %w", src, err)
	}
	dst := src.Context().Tag(tag)
	if err := remote.Tag(dst, desc, opts...); err != nil {
		return fmt.Errorf("tag %s: %w", dst, err)
	}
	return nil
}

// Contents are the digests of a pushed image, as a pull fetches them: its manifest,
// its config and its layers (what a node must be able to get from somewhere to pull it).
func (r *Registry) Contents(ctx context.Context, img Image) ([]string, error) {
	ref, err := name.ParseReference(img.Ref(), name.Insecure)
	if err != nil {
		return nil, err
	}
	opts := []remote.Option{remote.WithContext(ctx)}
	if r.User != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}))
	}
	got, err := remote.Image(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", ref, err)
	}
	m, err := got.Manifest()
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	out := []string{img.Digest, m.Config.Digest.String()}
	for _, l := range m.Layers {
		out = append(out, l.Digest.String())
	}
	return out, nil
}
