package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/registry"
)

// FromRegistry is the registry as a Source, reached through the node's own access
// (registry.Client: registries.conf and its mirrors, certs.d, the pull secret).
func FromRegistry(c *registry.Client) Source { return registrySource{c} }

type registrySource struct{ c *registry.Client }

// Manifest is the registry's manifest repo@d, within stallTimeout: a manifest is read
// whole (containers/image, at most 4 MiB), so the fill's bound on a blob (stallTimeout
// without a byte) bounds the whole fetch. A registry that takes the request and never
// answers ends it then, not only once every request waiting on it has gone.
func (s registrySource) Manifest(ctx context.Context, repo string, _ []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, stallTimeout, errRegistryStalled)
	defer cancel()
	data, mt, err := s.c.Manifest(ctx, repo, d)
	if err != nil {
		if errors.Is(context.Cause(ctx), errRegistryStalled) {
			err = fmt.Errorf("%s: the registry sent no manifest within %s: %w", d, stallTimeout, err)
		}
		return nil, "", err
	}
	if size >= 0 && int64(len(data)) != size {
		return nil, "", fmt.Errorf("%s: the registry sent %d bytes, the index naming it gives %d: %w", d, len(data), size, ErrSize)
	}
	return data, mt, nil
}

// errRegistryStalled ends a registry's manifest fetch that took stallTimeout.
var errRegistryStalled = errors.New("the registry stalled")

func (s registrySource) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	if len(chain) == 0 {
		return nil, 0, errors.New("no manifest names " + d.String() + " on this node")
	}
	body, announced, err := s.c.Blob(ctx, repo, chain[0], d)
	if err != nil {
		return nil, 0, err
	}
	bounded, err := Bound(d, body, announced, size, "registry")
	return bounded, announced, err
}
