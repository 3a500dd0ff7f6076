package registry

import "go.podman.io/image/v5/types"

// FromSystemContext is a Client that reaches each image by sys(image) in place of a
// Config and Credentials, with the default Timeout and bounds. It exists only for the
// forwarding release.DockerSource, kept while cmd/imagepinctl/check.go (edited on another
// branch) still hands a release a Client's SystemContext; remove both once it passes the
// Client itself.
//
// Deprecated: use New and the Client's methods.
func FromSystemContext(sys func(image string) *types.SystemContext) *Client {
	c := New(Config{}, nil)
	c.sysFor = sys
	return c
}
