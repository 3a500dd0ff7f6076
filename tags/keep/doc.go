// Package keep makes the node's runtime know the tags the sets pin
// (repo:tag@sha256:…) as their pinned digests, so that a pod naming the tag with
// IfNotPresent finds it on the node with the registry gone.
//
// It owns the tags wanted (Want, from the agent's desired sets), answers the node-local
// mirror's question of which digest a pinned tag stands for (Lookup: only tags in Want),
// and runs one loop (Run) that makes the runtime hold each tag: on containerd an image
// record repo:tag with the digest record's target (Records); on CRI-O a pull of repo:tag
// through the node-local mirror's TLS endpoint, which answers the tag with the pinned
// digest (Pulls). A tag whose digest is not on the node yet waits for it; a tag
// removed behind imagepind's back is made again at the next pass.
package keep
