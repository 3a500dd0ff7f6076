package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API's coordinates.
const (
	Group    = "imagepin.io"
	Version  = "v1alpha1"
	Kind     = "PinnedImageSet"
	Resource = "pinnedimagesets"
)

// APIVersion is the apiVersion of a PinnedImageSet document of this API.
const APIVersion = Group + "/" + Version

// GroupVersionResource is what the dynamic client needs.
var GroupVersionResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// RoleLabel names an OpenShift pool: role R selects nodes labelled node-role.kubernetes.io/R.
const RoleLabel = "machineconfiguration.openshift.io/role"

// PinnedImageSet is one set of images to pin and pre-load on the nodes it selects.
type PinnedImageSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is what to pin and where. The nodes: spec.nodeSelector and/or the pool label
// (both must match when both are given); neither selects no node.
type Spec struct {
	NodeSelector  *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	PinnedImages  []PinnedImageRef      `json:"pinnedImages,omitempty"`
	ReleaseImage  string                `json:"releaseImage,omitempty"`
	OSImageStream string                `json:"osImageStream,omitempty"`
}

// PinnedImageRef is one image, by digest: repo@sha256:… or repo:tag@sha256:… (the
// digest is what is pinned; the node also knows the tag as that digest).
type PinnedImageRef struct {
	Name string `json:"name"`
}

// Condition types of the status.
const (
	ConditionReady       = "Ready"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
	// ConditionRegistryIndependent: on every targeted node, pods start from the set's
	// images with the registry gone (Ready, and the kubelet's image pull credential
	// verification will not send them to the registry), and every blob of the images is
	// held by 2 nodes, so a node joining or replacing one gets them from its peers. When
	// False its message says apart the nodes where pods would need the registry when
	// they start, the nodes not Ready, and the blobs held by too few nodes.
	ConditionRegistryIndependent = "RegistryIndependent"
)

// Status is the rollup across the targeted nodes, written by the aggregator's leader.
// Every field is always written (a merge patch of the whole status), so nothing stale stays.
type Status struct {
	ObservedGeneration int64 `json:"observedGeneration"`
	// Nodes is "ready/targeted", for the printer column.
	Nodes string `json:"nodes"`
	// Targeted are the Nodes the selector matches now, whether or not they reported.
	TargetedNodes    int `json:"targetedNodes"`
	ReadyNodes       int `json:"readyNodes"`
	ProgressingNodes int `json:"progressingNodes"`
	FailedNodes      int `json:"failedNodes"`
	// UnknownNodes are targeted nodes with no current report of this set: silent, never
	// reported, or not (yet) holding the set's current spec.
	UnknownNodes int `json:"unknownNodes"`
	// Images and bytes are summed over the targeted nodes that reported the set.
	ImagesTotal int    `json:"imagesTotal"`
	ImagesReady int    `json:"imagesReady"`
	BytesTotal  uint64 `json:"bytesTotal"`
	BytesReady  uint64 `json:"bytesReady"`
	// Progress is "NN%" of bytes (of images when no sizes are known), for the printer column.
	Progress string `json:"progress"`
	// ETASeconds is the slowest progressing node's estimate; null when none is known.
	ETASeconds *int64 `json:"etaSeconds"`
	// FailingNodes are the first nodes (Failed first, then Unknown) with reason and message.
	FailingNodes []NodeState        `json:"failingNodes"`
	Conditions   []metav1.Condition `json:"conditions"`
}

// NodeState is one node's state for the set.
type NodeState struct {
	Node    string `json:"node"`
	Phase   string `json:"phase"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// MaxFailingNodes bounds status.failingNodes: at 5,000 nodes the first few name the problem.
const MaxFailingNodes = 10
