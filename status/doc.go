// Package status is the node status model shared by imagepind, the aggregator and
// imagepinctl: sets, phases, conditions and images, and the count of who holds the
// pinned images' blobs. It has no dependencies beyond the standard library (and
// internal/bytesize for the sizes its words give) so every part of the system can use
// it; CRI types, protobufs and the JSON file are converted at their own edges.
package status
