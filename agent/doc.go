// Package agent is imagepind's reconcile loop. One goroutine owns all state and runs the
// steps in order: read the inputs (set files, node labels, pull secret) → the sets
// that apply to this node → which images are present → disk check → the managed pin
// drop-in → reload CRI-O → confirm the pins are in effect → pull what is missing →
// publish status. Pulls run on a bounded pool of workers that report back to the loop.
//
// A set that leaves (file deleted, selector no longer matching) keeps its pins for
// unpin_delay, per image, so a sync that deletes and re-creates a file, or a half-synced
// file that lists fewer images for a moment, unpins nothing. imagepind never deletes
// an image.
package agent
