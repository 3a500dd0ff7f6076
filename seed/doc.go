// Package seed imports images from offline media (an OCI image layout, the
// distribution registry's storage layout; a directory or a tar of either) into the
// node's blob store, the store imagepind's node-local mirror serves from, and keeps a
// record of each import (a seed) under the state directory.
//
// It owns <state_dir>/seeds: the records, the lock that lets one seed run at a time,
// and the store's ingests under the "seed-" ref prefix. It promises that every manifest
// and blob is checked against its digest while it streams into the store, that a bad
// medium (a damaged tar, a wrong digest, a missing blob, a path or link out of the
// medium) stores nothing, that a seed's record names only what the store holds
// (written after its last blob is committed), and that a seed cut short (kill -9)
// resumes when run again. What the store keeps for a seed, imagepind's prune keeps too
// (Digests), and the node's status sums it (Tally). Serving seeded images is not done
// here: the node-local mirror serves pinned images from the store (package mirror), and
// the disk check sizes them from it (registry.ResolveStored).
package seed
