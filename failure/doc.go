// Package failure says what a failed pull or registry read means for a set: Transient
// (it may go away by itself: the network, a 5xx, a timeout, the runtime down),
// Unavailable (the image cannot be had without a change: manifest unknown, access
// denied, no manifest for the platform) or NoSpace (the image filesystem is full).
//
// Classify decides from the error's text, as the runtime and containers/image word it
// (a pull through mirrors included), and from ErrRuntimeUnavailable; an error it does not
// know is Transient, so that only an error known to need a change stops the retries.
// It is a leaf: the CRI client (cri), the registry access (registry) and the agent all
// classify with it.
package failure
