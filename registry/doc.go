// Package registry reaches container registries exactly as the node's runtime does:
// containers/image's docker transport with the node's registries.conf (mirrors in
// order, digest-only mirrors, blocked and insecure registries; for containerd,
// hosts.toml translated to it), certs.d, and the credentials the kubelet would hand the
// runtime for an image (the pull secret). It resolves a reference to the node's
// platform and its layers, reads small byte ranges of blobs (a layer's uncompressed
// size from its gzip trailer or zstd header), records which endpoint served an image,
// and measures how far the registry is.
//
// It is imagepin's one way to a registry: the disk check sizes images with it,
// imagepinctl resolve and release read manifests with it (SystemContext), and the next
// capability that fetches blobs uses it too. Every size it reads from the network is
// bounded (MaxLayerSize) and summed with AddSat, so nothing a registry says can wrap.
package registry
