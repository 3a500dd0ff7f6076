// Package release expands an OpenShift release image into the images a node needs.
//
// A release image carries release-manifests/image-references (an ImageStream: one tag per
// component, each a digest pull spec) and release-manifests/release-metadata
// (cincinnati-metadata-v0: the version, and release.openshift.io/architecture: multi for
// multi payloads), in its last layer. Multi payloads are manifest lists, and so are their
// components: the list digests are pinned as they appear (CRI-O picks each node's
// platform); the node's platform is only used to read the release's contents.
//
// OS images (rhel-coreos, rhel-coreos-extensions, rhel-coreos-10, …; OKD's stream-coreos)
// belong to streams named by their io.openshift.os.streamclass label, or, unlabelled, by
// their tag pair. A node needs the OS images of its own stream only; the release image
// itself is needed on control-plane nodes only (the CVO runs it); every other component
// goes to every pool.
//
// Images are read through a Source, the node's registry access (*registry.Client:
// registries.conf mirrors, certs.d, the pull secret, with its timeouts, bounds and error
// classes); release opens no image itself. Cached keeps each expansion, in memory and in
// the state directory, so a release by digest is read from its registry once.
package release
