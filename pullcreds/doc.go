// Package pullcreds holds the credentials of a pull: the kubelet's pull secret (a
// config.json with "auths", /var/lib/kubelet/config.json on a node) and the kubelet's rules
// for which of its entries an image gets (the host, "*" globs per DNS label, the longest
// repository path prefix; index.docker.io keys stand for docker.io).
//
// SecretFile is the one reader of the pull secret file: it reads it again when its mtime
// or size changes, and keeps the last good credentials when it cannot. No error, log
// line or String of this package ever quotes a secret or the file's content.
//
// It is a leaf: the CRI client (cri) hands these credentials to the runtime with a pull,
// and the registry access (registry) uses them to read images as the runtime would.
package pullcreds
