// Package cri talks to the container runtime over CRI v1 (gRPC on a unix socket): the
// runtime version, image status (present, pinned), pulls, and the image filesystem. gRPC
// status codes are converted here, at the edge; the runtime's error text is kept word
// for word. It also reads the kubelet's pull secret to find a pull's credentials.
package cri
