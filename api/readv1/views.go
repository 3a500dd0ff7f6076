// Package readv1 is the aggregator's read API (/v1/sets, /v1/sets/{name}, /v1/nodes,
// /v1/nodes/{name}): the JSON views of sets across the cluster and of nodes. The
// aggregator computes them; imagepinctl status --aggregator reads them without linking
// the server.
package readv1

import (
	"time"

	"github.com/imagepin/imagepin/status"
)

// SetView is one set across the cluster.
type SetView struct {
	Name string `json:"name"`
	// Ready is true only when every targeted node is Ready and none is Unknown.
	Ready            bool      `json:"ready"`
	Targeted         int       `json:"targeted"`
	ReadyNodes       int       `json:"readyNodes"`
	FailedNodes      int       `json:"failedNodes"`
	ProgressingNodes int       `json:"progressingNodes"`
	UnknownNodes     int       `json:"unknownNodes"`
	ImagesTotal      int       `json:"imagesTotal"`
	ImagesReady      int       `json:"imagesReady"`
	BytesTotal       uint64    `json:"bytesTotal"`
	BytesReady       uint64    `json:"bytesReady"`
	ETASeconds       *float64  `json:"etaSeconds,omitempty"`
	Nodes            []SetNode `json:"nodes"`
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
