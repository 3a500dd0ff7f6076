package failure

import (
	"context"
	"errors"
	"strings"
)

// Class is what a failed pull means for the set.
type Class int

const (
	// Transient errors may go away by themselves: network, 5xx, timeouts, runtime down.
	Transient Class = iota
	// Unavailable: the image cannot be had without a change (manifest unknown, access
	// denied, no manifest for this platform).
	Unavailable
	// NoSpace: the image filesystem is full.
	NoSpace
)

// ErrRuntimeUnavailable means the container runtime did not answer (down, restarting,
// socket missing): always Transient. The CRI client wraps it (cri.ErrUnavailable is this
// error).
var ErrRuntimeUnavailable = errors.New("container runtime unavailable")

// permanent are fragments of containers/image and registry errors that retrying will
// not fix.
var permanent = []string{
	"manifest unknown",
	"name unknown",
	"not found",
	"unauthorized",
	"authentication required",
	"denied",
	"forbidden",
	"no image found in manifest list",
	"no image found in image index",
	"choosing image instance",
	"invalid reference format",
	"digest did not match",
	"manifest invalid",
	"blocked",
}

// Classify sorts a pull error. Unknown errors are transient: retried with backoff, and
// a set leaves Pulling only when the error is known to need a change.
func Classify(err error) Class {
	if err == nil {
		return Transient
	}
	if errors.Is(err, ErrRuntimeUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Transient
	}
	msg := strings.ToLower(err.Error())
	if strings.Contains(msg, "no space left on device") {
		return NoSpace
	}
	// containers/image (and so CRI-O) reports a pull through mirrors as
	// "(Mirrors also failed: [mirror: err]\n[mirror: err]): source: err". If any endpoint
	// answered for good (the mirror of a disconnected cluster says "manifest unknown"
	// while the source does not resolve), the image is unavailable until that changes.
	if parts := endpointErrors(msg); parts != nil {
		for _, p := range parts {
			if classifyOne(p) == Unavailable {
				return Unavailable
			}
		}
		return Transient
	}
	return classifyOne(msg)
}

func endpointErrors(msg string) []string {
	const marker = "(mirrors also failed: "
	i := strings.Index(msg, marker)
	if i < 0 {
		return nil
	}
	rest := msg[i+len(marker):]
	j := strings.LastIndex(rest, "): ")
	if j < 0 {
		return nil
	}
	return append(strings.Split(rest[:j], "\n"), rest[j+3:])
}

func classifyOne(msg string) Class {
	// A 5xx or a dropped connection can carry "not found" in a proxy's page; check
	// transient markers first.
	for _, t := range []string{"connection refused", "connection reset", "i/o timeout", "timeout", "tls handshake", "eof",
		"500 internal", "502 bad gateway", "503 service", "504 gateway", "too many requests", "toomanyrequests", "no such host", "network is unreachable"} {
		if strings.Contains(msg, t) {
			return Transient
		}
	}
	for _, p := range permanent {
		if strings.Contains(msg, p) {
			return Unavailable
		}
	}
	return Transient
}
