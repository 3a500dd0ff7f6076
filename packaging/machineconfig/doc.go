// Package machineconfig renders the MachineConfigs that install imagepin's configuration
// on a pool: imagepind's config, the node-labels file with the pool's role label, the sets
// directory (and, optionally, PinnedImageSet files in it), and the unit enabled. The
// Ignition (spec 3.4) inside is built with Ignition's own config types and validated
// with its parser; the file contents are the very files the RPM ships, so the two never
// drift. A MachineConfig cannot carry the binary: the RPM does.
package machineconfig
