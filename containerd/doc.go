// Package containerd holds what is specific to containerd: pins as containerd's CRI
// plugin knows them (the label io.cri-containerd.pinned=pinned on an image record in the
// k8s.io namespace, set and removed through containerd's images API, which the CRI
// plugin follows by its image events, no restart or reload), a record of which labels
// imagepind set (it never removes a label it did not set), which containerd versions
// pin, and containerd's registry hosts (hosts.toml under config_path) translated for
// the disk check's registry access.
package containerd
