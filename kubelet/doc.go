// Package kubelet reads what the node's kubelet is configured to do, from its files, as
// the kubelet reads them: its KubeletConfiguration with the drop-in directory merged
// (config.go), the records of the pulls it made itself (pullrecords.go), and from both
// whether pods will start from an image already on the node without the registry
// (credentials.go: KEP-2535's image pull credential verification, beta and on by
// default from Kubernetes 1.35).
package kubelet
