// Package crio holds what is specific to CRI-O: the one managed pin drop-in, reading the
// pinned_images of CRI-O's other config files exactly as CRI-O merges them, reading the
// live merged config CRI-O serves on its socket, which CRI-O versions apply pins on
// reload, and reloading CRI-O by a signal to the process that owns its socket.
//
// CRI-O reads crio.conf, then walks crio.conf.d (every file, any name, recursively, in
// lexical order); a later file's pinned_images replaces the earlier list. So imagepind
// writes a single drop-in that sorts last and holds the union of its sets and of the
// other files' patterns.
package crio
