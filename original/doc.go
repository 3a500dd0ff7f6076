// Package original keeps, for each runtime file imagepind writes (CRI-O's drop-ins,
// certs.d, containerd's hosts.toml), what that path held before imagepind first changed
// it: its bytes, mode and owner, or that there was no file, and the directories imagepind
// had to make for it. Each record is written once, atomically, in the state directory,
// before the first change, and never replaced by a later run; uninstall (package
// nodegiveback) puts every recorded path back from it (Restore).
package original
