// Package registry reaches container registries exactly as the node's runtime does:
// containers/image's docker transport with the node's registries.conf (mirrors in
// order, digest-only mirrors, blocked and insecure registries; for containerd,
// hosts.toml translated to it), certs.d, and the credentials the kubelet would hand the
// runtime for an image (the pull secret, pullcreds). It resolves a reference to the
// node's platform and its layers, reads small byte ranges of blobs (a layer's
// uncompressed size from its gzip trailer or zstd header), records which endpoint served
// an image, and measures how far the registry is.
//
// Client is imagepin's one way to a registry's images; nothing else opens a
// containers/image source: the disk check sizes images with it (Resolve), imagepinctl
// resolve looks tags up with it (ResolveTag), release expansion reads manifests, configs
// and layers with it (OpenImage), and the node-local mirror fetches through it (Manifest,
// Blob). What it promises: a request of Resolve, ResolveTag or OpenImage that waits for
// a registry has an answer within Config.Timeout or fails saying so (the mirror's
// Manifest and Blob run as long as the runtime's request does); an error of those that
// retrying cannot fix is an *UnavailableError (failure.Classify), keeping
// containers/image's text; every size it reads from the network is bounded
// (MaxLayerSize; an OpenImage blob's body by its size) and summed with AddSat, so
// nothing a registry says can wrap. Resolve caches by reference (images by digest are
// immutable); tags are never cached.
package registry
