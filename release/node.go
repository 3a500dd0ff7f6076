package release

import "slices"

// ForNode is what a node with these labels pins of the release: Images for a
// control-plane node or not, of the OS stream ("" = the release's default). The daemon
// and `imagepinctl check` both decide it here.
func (r Release) ForNode(labels map[string]string, stream string) ([]string, error) {
	return r.Images(IsControlPlane(labels), stream)
}

// Merge is a set's images with its release's: the set's own first, in their order, then
// each image of the release the set does not name itself.
func Merge(own, fromRelease []string) []string {
	out := slices.Clone(own)
	for _, img := range fromRelease {
		if !slices.Contains(out, img) {
			out = append(out, img)
		}
	}
	return out
}
