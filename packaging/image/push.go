package image

import (
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Push writes the image index of the layout in dir to ref (a tag or a repository) with
// opts (transport, credentials) and returns the pushed reference by digest, as
// `crane push DIR REF` does.
func Push(dir, ref string, opts ...remote.Option) (name.Digest, error) {
	idx, err := Index(dir)
	if err != nil {
		return name.Digest{}, err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Digest{}, fmt.Errorf("image: push %s: %w", ref, err)
	}
	if err := remote.WriteIndex(r, idx, opts...); err != nil {
		return name.Digest{}, fmt.Errorf("image: push %s to %s: %w", dir, ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return name.Digest{}, fmt.Errorf("image: push %s: %w", ref, err)
	}
	return r.Context().Digest(d.String()), nil
}
