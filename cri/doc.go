// Package cri talks to the container runtime over CRI v1 (gRPC on a unix socket): the
// runtime version, image status (present, pinned), pulls, and the image filesystem. gRPC
// status codes are converted here, at the edge; the runtime's error text is kept word
// for word (PullError), for failure.Classify to sort, and a runtime that does not answer
// is ErrUnavailable (failure.ErrRuntimeUnavailable). A pull's credentials are
// pullcreds.Auth, from the pull secret that package pullcreds reads.
package cri
