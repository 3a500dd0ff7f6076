// Package seedwatch (seed/watch) seeds the media an administrator copies or mounts into a watched
// directory ([seed] directory), and removes the seed of a medium taken away from it.
//
// Each entry of the directory (not hidden, not named as a partial copy) is a medium: a
// tar, or a directory holding an OCI layout, a registry's storage or oc-mirror's
// archives (package seed reads them). A medium is seeded once it is complete: its
// files, sizes and modification times unchanged for Config.Settle, and no process on
// the node holding one of its files open for writing. One that turns out bad is not
// tried again until it changes. Each medium is seeded once a run of imagepind, and again
// when it changes: one seeded before (a copy may keep its modification times) is read
// again at start, which writes nothing when the store holds it all.
//
// A medium recorded by a seed (whoever ran it) whose own entry is no longer in the
// directory, or that is an empty directory (a mount point whose medium was unmounted),
// is taken out of its seed's record; a seed left with no medium goes with what of it no
// set pins and no other seed names (seed.Seeder.Forget), as `imagepinctl seed --remove`
// does. A medium that is there but cannot be read (an I/O error, a stale share, a path
// too long, a file going mid-walk) is not gone: its seed stays. A directory that cannot
// be read removes nothing.
//
// The media not seeded for a fault of theirs (unreadable, refused, failed) are written
// with why on every change (seed.WriteMediaFaults), for the node's status and
// `imagepinctl seed --list`, until they are taken away or seeded.
//
// It owns nothing on disk but that list: the records and the store are package seed's.
// Run is one loop, woken by the directory's changes (package watch), while a medium
// settles, and every Config.Rescan.
package seedwatch
