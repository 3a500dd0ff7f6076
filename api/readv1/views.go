// Package readv1 is the aggregator's read API (/v1/sets, /v1/sets/{name}, /v1/nodes,
// /v1/nodes/{name}): the JSON views of sets across the cluster and of nodes. The
// aggregator computes them; imagepinctl status --aggregator reads them without linking
// the server.
package readv1

import (
	"sort"
	"time"

	"github.com/imagepin/imagepin/status"
)

// SetView is one set across the cluster.
type SetView struct {
	Name string `json:"name"`
	// Ready is true only when every targeted node is Ready and none is Unknown.
	Ready            bool   `json:"ready"`
	Targeted         int    `json:"targeted"`
	ReadyNodes       int    `json:"readyNodes"`
	FailedNodes      int    `json:"failedNodes"`
	ProgressingNodes int    `json:"progressingNodes"`
	UnknownNodes     int    `json:"unknownNodes"`
	ImagesTotal      int    `json:"imagesTotal"`
	ImagesReady      int    `json:"imagesReady"`
	BytesTotal       uint64 `json:"bytesTotal"`
	BytesReady       uint64 `json:"bytesReady"`
	// BytesFromRegistry are the bytes of the set's images the nodes fetched from
	// registries, summed over the nodes ([peers]: about the set's size once, not once
	// a node).
	BytesFromRegistry int64     `json:"bytesFromRegistry,omitempty"`
	ETASeconds        *float64  `json:"etaSeconds,omitempty"`
	Nodes             []SetNode `json:"nodes"`
	// RegistryIndependentNodes count the nodes whose RegistryIndependent condition is
	// True: pods start there from the set's images with the registry gone, and the node
	// had the count of every blob's holders.
	RegistryIndependentNodes int `json:"registryIndependentNodes"`
	// PodsStartNodes count the Ready nodes where pods start from the set's images with
	// the registry gone, whatever the count of holders (their PodsStartWithoutRegistry
	// condition, or RegistryIndependent, is True).
	PodsStartNodes int `json:"podsStartNodes"`
	// RegistryDependent are Ready nodes where pods would need the registry when they
	// start (the kubelet's credential verification, a tag not held), or where it cannot
	// be told: the first few, and how many in all. Not a node whose own pods start but
	// whose blobs too few nodes hold: BlobHolders says that.
	RegistryDependent      []NodeCondition `json:"registryDependent,omitempty"`
	RegistryDependentNodes int             `json:"registryDependentNodes"`
	// BlobHolders is the count of the nodes holding each blob of the set's images (as
	// the nodes that report the set name them): a node joining or replacing one with the
	// registry gone gets them from those holders. Its Status is "" from an older
	// aggregator.
	BlobHolders status.BlobHolders `json:"blobHolders"`
}

// RegistryGone says whether the set's pods start with the registry gone on every node it
// targets (PodsStartNodes) and every blob of its images has status.MinBlobHolders
// holders (BlobHolders, the aggregator's own count): what the set's RegistryIndependent
// condition, the status page and imagepinctl status --aggregator say.
func (v SetView) RegistryGone() bool {
	return v.Targeted > 0 && v.PodsStartNodes == v.Targeted && v.BlobHolders.Status == status.True
}

// NodeCondition is one node's condition of a set.
type NodeCondition struct {
	Node    string `json:"node"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// MaxRegistryDependent is how many nodes RegistryDependent lists.
const MaxRegistryDependent = 5

// ReasonNotReported is a Ready node's reason in RegistryDependent when it does not say
// whether its own pods start (an imagepind older than the aggregator).
const ReasonNotReported = "NotReported"

// AddRegistry counts, for a set of phase on node, its RegistryIndependent condition (c)
// and its node-local part (own, PodsStartWithoutRegistry). A Ready node whose own pods
// start counts in PodsStartNodes, though too few nodes hold its blobs; one that does
// not say (no own: an older imagepind) counts so only when c is True, and is listed
// with its reason when c's is its own (not the count of holders: that hid whether its
// own pods start).
func (v *SetView) AddRegistry(node string, phase status.Phase, c, own *status.Condition) {
	switch {
	case c != nil && c.Status == status.True:
		v.RegistryIndependentNodes++
		v.PodsStartNodes++
		return
	case phase != status.Ready:
		// Not Ready says more: the node is counted there.
		return
	case own != nil && own.Status == status.True:
		v.PodsStartNodes++
		return
	}
	v.RegistryDependentNodes++
	nc := NodeCondition{Node: node, Status: status.Unknown, Reason: ReasonNotReported,
		Message: "the node does not report RegistryIndependent (imagepind older than this aggregator)"}
	switch {
	case own != nil:
		nc.Status, nc.Reason, nc.Message = own.Status, own.Reason, own.Message
	case c != nil && c.Reason != status.ReasonBlobsNotHeld && c.Reason != status.ReasonBlobHoldersUnknown:
		nc.Status, nc.Reason, nc.Message = c.Status, c.Reason, c.Message
	case c != nil:
		nc.Message = "the node does not report whether its own pods start without the registry (imagepind older than this aggregator); its RegistryIndependent: " +
			c.Reason + ": " + c.Message
	}
	v.RegistryDependent = append(v.RegistryDependent, nc)
}

// FinishRegistry keeps the first MaxRegistryDependent nodes by name.
func (v *SetView) FinishRegistry() {
	sort.Slice(v.RegistryDependent, func(i, j int) bool { return v.RegistryDependent[i].Node < v.RegistryDependent[j].Node })
	if len(v.RegistryDependent) > MaxRegistryDependent {
		v.RegistryDependent = v.RegistryDependent[:MaxRegistryDependent]
	}
}

// SetNode is one node's state for a set.
type SetNode struct {
	Node         string               `json:"node"`
	Phase        string               `json:"phase"` // a status phase, or "Unknown"
	Reason       string               `json:"reason,omitempty"`
	Message      string               `json:"message,omitempty"`
	ImagesTotal  int                  `json:"imagesTotal"`
	ImagesReady  int                  `json:"imagesReady"`
	BytesTotal   uint64               `json:"bytesTotal"`
	BytesReady   uint64               `json:"bytesReady"`
	FailedImages []status.FailedImage `json:"failedImages,omitempty"`
	LastReport   *time.Time           `json:"lastReport,omitempty"`
	ETASeconds   *float64             `json:"etaSeconds,omitempty"`
}

// NodeView is one node as the aggregator sees it.
type NodeView struct {
	Name          string     `json:"name"`
	Unknown       bool       `json:"unknown"`
	NeverReported bool       `json:"neverReported,omitempty"`
	LastReport    *time.Time `json:"lastReport,omitempty"`
	AgeSeconds    float64    `json:"ageSeconds"`
	Heartbeat     string     `json:"heartbeat,omitempty"`
	BootID        string     `json:"bootId,omitempty"`
	Sets          int        `json:"sets"`
	SetsReady     int        `json:"setsReady"`
	Faults        []string   `json:"faults,omitempty"`
	// FileErrors are the set files the node could not use.
	FileErrors []status.FileError `json:"fileErrors,omitempty"`
}

// PhaseUnknown marks a node that went silent (or never reported).
const PhaseUnknown = "Unknown"
