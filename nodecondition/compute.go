package nodecondition

import (
	"fmt"
	"sort"
	"strings"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/status"
)

// Type is the Node condition's type.
const Type = v1alpha1.NodeConditionPinnedImagesReady

// Reasons of the condition.
const (
	// ReasonAllSetsReady: every set that targets the node is Ready (and registry
	// independent where that is asked for); also with no set targeting the node.
	ReasonAllSetsReady = "AllSetsReady"
	// ReasonSetsNotReady: some set is still Pending or Pulling.
	ReasonSetsNotReady = "SetsNotReady"
	// ReasonSetsDegraded: some set Failed on the node (no space, an image missing).
	ReasonSetsDegraded = "SetsDegraded"
	// ReasonRegistryDependent: every set is Ready, but pods would still need the
	// registry to start from some set's images on this node, or it cannot be told (its
	// PodsStartWithoutRegistry condition not True: the kubelet's credential verification).
	ReasonRegistryDependent = "RegistryDependent"
	// ReasonTagsNotHeld: every set is Ready, but the runtime does not hold every tag the
	// sets pin yet: a pod naming such a tag would pull it.
	ReasonTagsNotHeld = "TagsNotHeld"
)

// Mode is what True asks of each set.
type Mode int

const (
	// Ready: every set Ready.
	Ready Mode = iota
	// RegistryIndependent: every set Ready and RegistryIndependent True.
	RegistryIndependent
)

// Condition is the computed condition, before times are added.
type Condition struct {
	Status  string // status.True or status.False
	Reason  string
	Message string
}

// maxNamed bounds the sets a message names: the first few say what to look at.
const maxNamed = 10

// Compute is the condition of a node from imagepind's status. ok is false while the
// status cannot tell which sets target the node (the cluster sync has not written its
// first lists yet): nothing is written then.
// Which fact wins: a Failed set (Degraded), then sets not Ready, then pinned tags the
// runtime does not hold yet, then (in RegistryIndependent mode) sets this node's pods
// would still need the registry for (pinned tags that are not pre-loaded at all among
// them). The cluster's count of blob holders is not this node's: a set whose blobs too
// few nodes hold, while this node's own pods start from its images, is named in the
// True message (a node joining or replacing one would need the registry), and holds
// back neither the condition nor with it the startup taint.
func Compute(n status.Node, mode Mode) (Condition, bool) {
	if n.WaitingForClusterSync {
		return Condition{}, false
	}
	var failed, pending, dependent, stranded []string
	for _, s := range n.Sets {
		switch {
		case s.Phase == status.Failed:
			failed = append(failed, describe(s))
		case s.Phase != status.Ready:
			pending = append(pending, describe(s))
		case mode == RegistryIndependent:
			c := s.Condition(status.ConditionRegistryIndependent)
			own := s.Condition(status.ConditionPodsStartWithoutRegistry)
			switch {
			case c != nil && c.Status == status.True:
			case own == nil || c == nil:
				dependent = append(dependent, fmt.Sprintf("%s (not reported)", s.Name))
			case own.Status == status.True:
				// The node's own pods start: only the cluster's count stands in the way.
				stranded = append(stranded, fmt.Sprintf("%s (%s)", s.Name, c.Reason))
			default:
				// The node's own reason: the whole's may be the cluster's count
				// (BlobsNotHeld, a sure False) before an unsure kubelet.
				dependent = append(dependent, fmt.Sprintf("%s (%s)", s.Name, own.Reason))
			}
		}
	}
	if len(dependent) > 0 {
		dependent = append(dependent, stranded...)
	}
	switch {
	case len(failed) > 0:
		msg := "sets failed on this node: " + list(failed)
		if len(pending) > 0 {
			msg += "; not Ready yet: " + list(pending)
		}
		return Condition{Status: status.False, Reason: ReasonSetsDegraded, Message: msg}, true
	case len(pending) > 0:
		return Condition{Status: status.False, Reason: ReasonSetsNotReady, Message: "sets not Ready yet: " + list(pending)}, true
	case n.Tags != nil && n.Tags.Kept && n.Tags.Held < n.Tags.Pinned:
		return Condition{Status: status.False, Reason: ReasonTagsNotHeld,
			Message: fmt.Sprintf("sets Ready; %d of %d pinned tags not given to the runtime yet (a pod naming one would pull it)",
				n.Tags.Pinned-n.Tags.Held, n.Tags.Pinned)}, true
	case mode == RegistryIndependent && n.Tags != nil && !n.Tags.Kept && n.Tags.Pinned > 0:
		dependent = append(dependent, fmt.Sprintf("%d pinned tags (not pre-loaded on this node)", n.Tags.Pinned))
		return Condition{Status: status.False, Reason: ReasonRegistryDependent,
			Message: "sets Ready, but pods would need the registry to start from their images: " + list(dependent)}, true
	case len(dependent) > 0:
		return Condition{Status: status.False, Reason: ReasonRegistryDependent,
			Message: "sets Ready, but pods would need the registry to start from their images: " + list(dependent)}, true
	case len(n.Sets) == 0:
		return Condition{Status: status.True, Reason: ReasonAllSetsReady, Message: "no PinnedImageSet targets this node"}, true
	}
	what := "Ready"
	if mode == RegistryIndependent {
		what = "Ready and registry independent"
		if len(stranded) > 0 {
			what += " on this node"
		}
	}
	names := make([]string, 0, len(n.Sets))
	for _, s := range n.Sets {
		names = append(names, s.Name)
	}
	msg := fmt.Sprintf("%d of %d sets %s: %s", len(n.Sets), len(n.Sets), what, list(names))
	if len(stranded) > 0 {
		msg += fmt.Sprintf("; a node joining or replacing one would need the registry: blobs of the images of %s are not held by %d nodes (their RegistryIndependent names them)",
			list(stranded), status.MinBlobHolders)
	}
	return Condition{Status: status.True, Reason: ReasonAllSetsReady, Message: msg}, true
}

func describe(s status.Set) string {
	switch s.Phase {
	case status.Pulling:
		return fmt.Sprintf("%s (Pulling %d/%d images)", s.Name, s.ImagesReady, s.ImagesTotal)
	case status.Failed:
		if c := s.Condition(status.ConditionFailed); c != nil && c.Reason != "" {
			return fmt.Sprintf("%s (Failed: %s)", s.Name, c.Reason)
		}
	}
	return fmt.Sprintf("%s (%s)", s.Name, s.Phase)
}

// list names the first maxNamed entries in order and counts the rest.
func list(items []string) string {
	sort.Strings(items)
	if len(items) <= maxNamed {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:maxNamed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxNamed)
}
