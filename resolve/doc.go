// Package resolve turns image tags into the digests the set format wants: it asks the
// registry which manifest a tag names, through the node's registry access (Registry,
// *registry.Client's ResolveTag: the registries.conf mirrors, certs.d and credentials, as
// CRI-O would pull the tag; its timeouts and error classes), and rewrites set documents
// with the digests, keeping the rest of each document as it was. What a reference must
// be (fully qualified, a sha256 digest) is decided here; a Resolver asks for each
// reference once, a bounded number at a time.
package resolve
