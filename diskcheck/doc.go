// Package diskcheck decides, before anything is pinned or pulled, whether the node's
// image filesystem can hold the images a node still misses, and whether it can reach
// them at all.
//
// Sizes come from the registries through package registry, which reaches them exactly
// as the node's runtime does; this package keeps the sizing policy (Need), the space
// (statfs, the kubelet's GC threshold) and the admission.
// Layers count once by digest across all images and sets; the need is
// layer_size_multiplier × those compressed bytes. Space is statfs of the runtime's image
// filesystem against what is free and against the kubelet's image GC high threshold.
// Sets are admitted in name order while their cumulative need fits.
package diskcheck
