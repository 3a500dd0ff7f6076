package status

import "time"

// Phase is where a set stands on a node.
type Phase string

const (
	// Pending: known, nothing done yet (waiting for the disk check, CRI-O, or another set).
	Pending Phase = "Pending"
	// Pulling: pins written; images being pulled, including retries of transient errors.
	Pulling Phase = "Pulling"
	// Ready: every image present and CRI-O confirmed to have every pin in effect.
	Ready Phase = "Ready"
	// Failed: cannot progress without a change. Retries go on with backoff.
	Failed Phase = "Failed"
)

// Condition types.
const (
	ConditionReady       = "Ready"
	ConditionProgressing = "Progressing"
	ConditionFailed      = "Failed"
	ConditionDiskChecked = "DiskChecked"
	// ConditionRegistryIndependent: pods can start from the set's images on this node
	// with the registry gone, and a node joining or replacing one gets them from its
	// peers. True only when the set is Ready, the runtime holds the tags it pins as
	// their pinned digests, the kubelet's image pull credential verification (KEP-2535)
	// will not send them to the registry, and the cluster's nodes hold every blob of the
	// images at least MinBlobHolders times (package registrygone).
	ConditionRegistryIndependent = "RegistryIndependent"
	// ConditionPodsStartWithoutRegistry is RegistryIndependent's node-local part alone:
	// pods start from the set's images on this node with the registry gone (the set is
	// Ready, the runtime holds the tags it pins as their pinned digests, and the kubelet
	// will not pull at pod start), whatever the cluster's count of the blobs' holders.
	// Its reasons are RegistryIndependent's but the holders' (ReasonImagesHeld when
	// True). A node that does not report it (an imagepind older than the aggregator)
	// does not say: its own pods starting is not assumed.
	ConditionPodsStartWithoutRegistry = "PodsStartWithoutRegistry"
)

// Condition statuses, as in Kubernetes.
const (
	True    = "True"
	False   = "False"
	Unknown = "Unknown"
)

// Reasons carried by conditions.
const (
	ReasonAllImagesPinned    = "AllImagesPinned"
	ReasonCheckingDisk       = "CheckingDisk"
	ReasonWaitingForReload   = "WaitingForReload"
	ReasonPulling            = "Pulling"
	ReasonRuntimeUnavailable = "RuntimeUnavailable"
	ReasonPullRetrying       = "PullRetrying"
	ReasonExpandingRelease   = "ExpandingRelease"

	ReasonInsufficientDiskSpace = "InsufficientDiskSpace"
	ReasonImageUnavailable      = "ImageUnavailable"
	ReasonInvalidSpec           = "InvalidSpec"
	ReasonPinsOverridden        = "PinsOverridden"
	ReasonRuntimeTooOld         = "RuntimeTooOld"

	ReasonNotImplemented = "NotImplemented"
	ReasonSpaceAvailable = "SpaceAvailable"
	ReasonNotFailed      = "NotFailed"
	ReasonNotReady       = "NotReady"
	ReasonIdle           = "Idle"

	// RegistryIndependent's reasons.
	ReasonPodsStartWithoutRegistry = "PodsStartWithoutRegistry"
	ReasonCredentialVerification   = "CredentialVerification"
	ReasonKubeletConfigUnreadable  = "KubeletConfigUnreadable"
	ReasonCheckingKubelet          = "CheckingKubelet"
	// ReasonTagsNotHeld: a tag the set pins is not held by the runtime as its pinned
	// digest, so pods naming the tag would pull it.
	ReasonTagsNotHeld = "TagsNotHeld"
	// ReasonBlobsNotHeld: some blob of the set's images is held by fewer than
	// MinBlobHolders nodes, so a node joining or replacing one would need the registry;
	// ReasonBlobHoldersUnknown: the holders cannot be counted (no aggregator's answer).
	// Both are the cluster's: they say nothing of this node's own pods
	// (ConditionPodsStartWithoutRegistry does).
	ReasonBlobsNotHeld       = "BlobsNotHeld"
	ReasonBlobHoldersUnknown = "BlobHoldersUnknown"
	// ReasonImagesHeld: PodsStartWithoutRegistry is True: the runtime holds every image
	// and pinned tag, and the kubelet will not pull them at pod start.
	ReasonImagesHeld = "ImagesHeld"
)

// FaultWaitingForClusterSync is the fault a node's status carries while
// WaitingForClusterSync.
const FaultWaitingForClusterSync = "cluster sync: waiting for the first list of PinnedImageSets and of this Node"

// Node is the whole report of one node: what imagepind writes to the status file and
// sends to the aggregator.
type Node struct {
	Updated    time.Time   `json:"updated"`
	Node       NodeInfo    `json:"node"`
	Sets       []Set       `json:"sets"`
	FileErrors []FileError `json:"fileErrors,omitempty"`
	// Faults are node-wide problems that stop nothing but need an administrator:
	// the sets directory gone, the labels file broken, CRI-O unreachable.
	Faults []string `json:"faults,omitempty"`
	// WaitingForClusterSync: the cluster sync has not written its first lists of
	// PinnedImageSets and of this Node yet, so Sets may lack sets that target the node.
	// Faults say so too, in FaultWaitingForClusterSync's words. Not sent to the
	// aggregator, which knows the sets itself.
	WaitingForClusterSync bool `json:"waitingForClusterSync,omitempty"`
	// Tags are the tags the sets pin (nil: none).
	Tags *Tags `json:"tags,omitempty"`
	// Untargeted are the sets read that target no node at all (an imagepin.io set with
	// neither spec.nodeSelector nor a role label, a v1 set without a role label): they
	// apply nowhere, here or elsewhere. In name order.
	Untargeted []Untargeted `json:"untargeted,omitempty"`
	// Blobs are the pinned images' blobs and which the node holds for its peers, for
	// the aggregator's count of holders (not in the status file: thousands of digests).
	Blobs []ImageBlobs `json:"-"`
}

// Untargeted is a set read that targets no node: its name, its file, and why.
type Untargeted struct {
	Name string `json:"name"`
	File string `json:"file"`
	Why  string `json:"why"`
}

// NodeInfo describes the node and its container runtime.
type NodeInfo struct {
	Name            string          `json:"name"`
	Architecture    string          `json:"architecture"`
	Version         string          `json:"version"`
	Runtime         Runtime         `json:"runtime"`
	ImageFilesystem ImageFilesystem `json:"imageFilesystem"`
	// Peers are the blob bytes by where they came from or went ([peers] on).
	Peers *PeerBytes `json:"peers,omitempty"`
	// Seeded is what imagepinctl seed put in the blob store (nil: no seeds).
	Seeded *Seeded `json:"seeded,omitempty"`
}

// Seeded sums a node's complete seeds: each image, manifest and blob once. Their bytes
// are in the store (PeerBytes.Stored) until the seed is removed, pinned or not.
type Seeded struct {
	Seeds  int   `json:"seeds"`
	Images int   `json:"images"`
	Bytes  int64 `json:"bytes"`
}

// PeerBytes are a node's bytes of pinned images' manifests and blobs since imagepind
// started: fetched from registries (for itself or for a peer), read from peers, served
// to peers; and what its blob store holds. Address is where it serves its peers ("":
// it shares nothing).
type PeerBytes struct {
	Address      string `json:"address,omitempty"`
	FromRegistry int64  `json:"fromRegistry"`
	FromPeers    int64  `json:"fromPeers"`
	ToPeers      int64  `json:"toPeers"`
	Stored       int64  `json:"stored"`
}

// Runtime is the container runtime as CRI Version reports it.
type Runtime struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// ImageFilesystem is where the runtime stores images, and how full it is.
type ImageFilesystem struct {
	Path          string `json:"path"`
	CapacityBytes uint64 `json:"capacityBytes"`
	FreeBytes     uint64 `json:"freeBytes"`
}

// Set is the state of one PinnedImageSet on this node.
type Set struct {
	Name        string `json:"name"`
	UID         string `json:"uid"`
	SpecHash    string `json:"specHash"`
	File        string `json:"file"`
	Phase       Phase  `json:"phase"`
	ImagesTotal int    `json:"imagesTotal"`
	ImagesReady int    `json:"imagesReady"`
	BytesTotal  uint64 `json:"bytesTotal"`
	BytesReady  uint64 `json:"bytesReady"`
	// BytesFromRegistry are the bytes of the set's images this node fetched from
	// registries, for itself or for its peers ([peers]; as of the last status).
	BytesFromRegistry int64         `json:"bytesFromRegistry,omitempty"`
	Conditions        []Condition   `json:"conditions"`
	FailedImages      []FailedImage `json:"failedImages,omitempty"`
	// Release is set for a set with spec.releaseImage.
	Release *Release `json:"release,omitempty"`
}

// Release is what a set's release image expanded to on this node.
type Release struct {
	Image   string `json:"image"`
	Version string `json:"version"`
	// Images is how many images it expanded to on this node (its role and OS stream).
	Images int `json:"images"`
	// Error says why it could not be expanded (yet).
	Error string `json:"error,omitempty"`
}

// Condition follows the Kubernetes condition shape.
type Condition struct {
	Type               string    `json:"type"`
	Status             string    `json:"status"`
	Reason             string    `json:"reason"`
	Message            string    `json:"message"`
	LastTransitionTime time.Time `json:"lastTransitionTime"`
}

// FailedImage is an image that could not be pulled; Error is the runtime's text, word for word.
type FailedImage struct {
	Image  string `json:"image"`
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

// FileError is a sets-directory file that does not parse or validate. File is relative to
// the sets directory.
type FileError struct {
	File  string `json:"file"`
	Error string `json:"error"`
}

// Condition returns the condition of the given type, or nil.
func (s *Set) Condition(conditionType string) *Condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == conditionType {
			return &s.Conditions[i]
		}
	}
	return nil
}

// SetCondition sets a condition, keeping its LastTransitionTime when the status does not change.
func (s *Set) SetCondition(c Condition, now time.Time) {
	if old := s.Condition(c.Type); old != nil {
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = now
		}
		*old = c
		return
	}
	c.LastTransitionTime = now
	s.Conditions = append(s.Conditions, c)
}

// Set returns the set with the given name, or nil.
func (n *Node) Set(name string) *Set {
	for i := range n.Sets {
		if n.Sets[i].Name == name {
			return &n.Sets[i]
		}
	}
	return nil
}
