// Package pin is the runtime-neutral vocabulary of pinning, shared by the agent and the
// runtime-specific parts that implement it (package crio: CRI-O's managed drop-in,
// reloaded and confirmed; package containerd: containerd's pinned label on each image
// record): what a runtime version can do with pins, and what a write of the pins
// produced. It depends only on the reference grammar (distribution/reference).
package pin

import "slices"

// Support is what a runtime version can do with pins.
type Support struct {
	// PinnedField: CRI ImageStatus reports Image.pinned, so a pin can be confirmed
	// image by image.
	PinnedField bool
	// WithoutRestart: new pins take effect without restarting the runtime (CRI-O: on
	// reload, from 1.29.4/1.30.0; containerd: at once, from 1.7).
	WithoutRestart bool
	// Problem, when set, explains for status why pins will not apply ("" when they will).
	Problem string
}

// Written is what writing the pins produced.
type Written struct {
	// Changed: the runtime's configuration changed, so it must be applied (a reload)
	// and confirmed.
	Changed bool
	// Effective is every pattern the runtime has in effect once the write is applied:
	// imagepind's and those of others (CRI-O's other config files).
	Effective []string
	// Overriders are what overrides imagepind's pins (CRI-O config files read after the
	// managed drop-in that set pinned_images).
	Overriders []string
	// Faults are problems to show in the node's status (a config file that does not
	// parse, a pattern that could not be copied).
	Faults []string
	// Recheck are images the runtime changed behind imagepind's back (a record
	// deleted, a label dropped): what the agent knows of them is stale.
	Recheck []string
}

// Stable returns prev when next holds the same patterns, else a copy of next: a list that
// did not change comes back as the same slice, so what the agent compiled from it (a
// matcher of thousands of patterns) stays valid.
func Stable(prev, next []string) []string {
	if slices.Equal(prev, next) {
		return prev
	}
	return slices.Clone(next)
}
