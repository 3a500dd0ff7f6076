// Package fsutil reads files that may be hostile (FIFOs, devices, huge files) without
// hanging or exhausting memory, and writes files atomically (temp file, fsync, rename,
// fsync of the directory) so a reader never sees half a file.
package fsutil
