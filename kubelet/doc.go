// Package kubelet reads what the node's kubelet is configured to do, from its files, as
// the kubelet reads them: its KubeletConfiguration with the drop-in directory merged
// (config.go), the records of the pulls it made itself (pullrecords.go), its version when
// those do not say whether its credential verification is on (version.go), and from them
// whether pods will start from an image already on the node without the registry
// (credentials.go: KEP-2535's image pull credential verification, beta and on by default
// from Kubernetes 1.35). Reader reads them all; Verification.Decide is the one answer the
// daemon and imagepinctl both give.
package kubelet
