// Package diskcheck decides, before anything is pinned or pulled, whether the node's
// image filesystem can hold a node's missing images, admitting sets in name order while
// their cumulative need fits. This version is a stub that admits everything and says so
// (DiskChecked Unknown/NotImplemented); the registry-backed check replaces it.
package diskcheck
