// Package starttaint lifts the startup taint (imagepin.io/images-not-ready:NoSchedule by
// default) off a Node once its PinnedImagesReady condition is True, so a node that joins
// gets no pods before its pinned images are in. The kubelet registers the node with the
// taint (registerWithTaints); NodeRestriction forbids a node to remove its own taints, so
// the aggregator's leader does it.
//
// Bootstrap only: the remover never adds the taint, and a condition turning False later
// leaves the node schedulable. It removes only taints with its key, with a JSON patch
// that tests the taint is still where it read it, so taints added at the same time are
// never dropped; a failed patch is retried with backoff from the informer's newer copy.
// Its Node cache holds the name, taints and the one condition of each node.
package starttaint
