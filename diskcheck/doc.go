// Package diskcheck decides, before anything is pinned or pulled, whether the node's
// image filesystem can hold the images a node still misses, and whether it can reach
// them at all.
//
// Sizes come from the registries exactly as CRI-O reaches them: containers/image's
// docker transport with the node's registries.conf (mirrors in order, digest-only
// mirrors, blocked and insecure registries), certs.d, and the credentials the kubelet
// would hand CRI-O for that image. A manifest list resolves to the node's platform.
// Layers count once by digest across all images and sets; the need is
// layer_size_multiplier × those compressed bytes. Space is statfs of the runtime's image
// filesystem against what is free and against the kubelet's image GC high threshold.
// Sets are admitted in name order while their cumulative need fits.
package diskcheck
