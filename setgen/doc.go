// Package setgen makes a PinnedImageSet from what the cluster runs: the images of pods
// (by the digest their runtime reports in the container statuses' image IDs) and the
// images of workload templates (a Deployment's, DaemonSet's or StatefulSet's
// spec.template: what the next rollout creates, tags resolved to digests through the
// registry as the node would pull them).
//
// It owns the decisions of that mapping: which repository a digest is pinned under
// (the one the pod names, when fully qualified), which tags are noted beside a digest,
// which images cannot be pinned (a local image ID with no registry digest, a container
// not started yet) and why. Images are deduplicated by digest reference and sorted, so
// the same workloads give the same document. Errors and warnings name the object and
// the container.
package setgen
