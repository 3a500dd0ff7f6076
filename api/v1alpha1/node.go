package v1alpha1

// NodeConditionPinnedImagesReady is the type of the condition imagepind writes on its
// own Node (package nodecondition): True when every PinnedImageSet that targets the node
// is Ready. The aggregator's leader lifts the startup taint once it is True
// (cluster/starttaint), and the Node Readiness Controller can gate a node on it. Part of
// imagepin's API, so that both sides name it without linking each other.
const NodeConditionPinnedImagesReady = "PinnedImagesReady"
