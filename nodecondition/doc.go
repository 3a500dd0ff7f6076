// Package nodecondition publishes imagepind's verdict on its own Node: the condition
// PinnedImagesReady, True when every PinnedImageSet that targets the node is Ready (and,
// in RegistryIndependent mode, pods start from its images with the registry gone), False
// with the reason and the sets still missing. The scheduler's helpers watch it: the
// aggregator lifts the startup taint on it (cluster/starttaint), and the Node Readiness
// Controller can gate a node on it.
//
// Compute decides the condition from the node's status, a pure function. Writer writes it
// with the node's own credentials through the Node's status subresource, merged by
// condition type, so the kubelet's conditions are never touched; on change (coalesced to
// at most one write every MinInterval; a change of status, False to True, at once unless
// the status changed less than MinInterval ago) and every Heartbeat unchanged; through an API
// outage with backoff, the latest condition winning when the API answers again. Nothing
// is written until the cluster sync has listed the sets and found the Node once; a True
// condition found at start is kept for a minute while the sets only wait to be confirmed,
// so a restart does not flip it. An Event on the Node (PinnedImagesReady, PinnedImagesNotReady) marks
// each change of status.
package nodecondition
