// Package image assembles imagepin's container image without a container engine or a
// base image: one layer per platform holding the static binaries under /usr/bin (and an
// empty /tmp), on nothing, written as an OCI layout whose index.json names one image
// index with a manifest per platform. Every byte is fixed by the inputs: entries sorted,
// owner 0:0, modes fixed, times and the config's created time set to one given instant
// (the commit's time), gzip at one level. So two builds from the same binaries give one
// index digest. Verify reads a layout back and checks each platform's binaries (ELF
// machine, static, executable, owned by root); Push sends a layout's index to a registry.
// Nothing here is linked by imagepind, imagepinctl or the aggregator.
package image
