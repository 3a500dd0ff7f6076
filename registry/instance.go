package registry

import (
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/types"
)

// Instance is the manifest an index (a manifest list) names for platform p: the one
// the runtime pulls on a node of p, chosen as containers/image chooses it (CRI-O's,
// and the disk check's). An error when data is no list, or names nothing for p.
func Instance(data []byte, p Platform) (digest.Digest, error) {
	mime := manifest.GuessMIMEType(data)
	if !manifest.MIMETypeIsMultiImage(mime) {
		return "", fmt.Errorf("not a manifest list (%s)", mime)
	}
	list, err := manifest.ListFromBlob(data, mime)
	if err != nil {
		return "", fmt.Errorf("parse manifest list: %w", err)
	}
	d, err := list.ChooseInstance(&types.SystemContext{OSChoice: p.OS, ArchitectureChoice: p.Architecture, VariantChoice: p.Variant})
	if err != nil {
		return "", fmt.Errorf("no manifest for %s: the list has %s", p, strings.Join(ListPlatforms(list), ", "))
	}
	return d, nil
}
