package registrygone

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
)

// Facts are what is known of one set on one node.
type Facts struct {
	// Images are the set's images (repo@sha256:…), a release's included.
	Images []string
	// RuntimeErr says why the container runtime does not answer (nil: it does); then
	// presence, pins and tags cannot be told.
	RuntimeErr error
	// Missing are the images not on the node; Unpinned those present but not pinned.
	Missing, Unpinned []string
	// NotReady says why the set's images are not all present and pinned when Missing
	// and Unpinned do not (pins not in effect yet, a release that cannot be expanded);
	// "" when nothing else stands in the way. It is not the runtime not answering:
	// that is RuntimeErr.
	NotReady string
	// Tags are the tags the set pins; Held says, by tag name, which the runtime holds
	// as their pinned digests (HeldTags).
	Tags []pinset.Tag
	Held map[string]bool
	// KubeletRead says the kubelet's files were read (false: not yet); KubeletErr why
	// they could not be; Verification what they say.
	KubeletRead  bool
	KubeletErr   error
	Verification kubelet.Verification
	// IDs maps the runtime's image names, as it spells them, to image IDs (CRI
	// ListImages, cri.Client.ImageNames): the kubelet keys its pull records by the ID
	// the runtime gives for the pod's image name.
	IDs map[string]string
	// Holders is the cluster's count of the holders of every blob of the images (the
	// aggregator's answer): a node joining, or replacing one, with the registry gone gets
	// them from its peers. Its Status "" or Unknown: it cannot be had (Unknown says why).
	Holders status.BlobHolders
}

// Verdict is the answer.
type Verdict struct {
	// Status is status.True, status.False or status.Unknown.
	Status string
	// Reason is a RegistryIndependent reason (status.Reason…): the first of what stands
	// in the way, a sure False before an Unknown.
	Reason string
	// Message says it in a line: when True, what holds; else Why joined.
	Message string
	// Why lists what stands in the way (nothing when True).
	Why []string
	// Node is the node-local part alone: whether pods start from the set's images on
	// this node with the registry gone (the images, the tags, the kubelet), whatever the
	// cluster's count of the blobs' holders says. Its Why are Why's but the holders'.
	Node Part
	// Policy is the kubelet's imagePullCredentialsVerificationPolicy in effect ("" when
	// its files were not read).
	Policy string
	// Kubelet is the kubelet's own answer for the images (its Needs and Unsure);
	// KubeletDecided false when its files were not read.
	Kubelet        kubelet.Decision
	KubeletDecided bool
}

// Part is one part of a verdict: its status (status.True, False or Unknown), reason,
// message and what stands in the way.
type Part struct {
	Status, Reason, Message string
	Why                     []string
}

// OwnPodsStart says this node's own pods start from the images with the registry gone:
// nothing stands in the way but, perhaps, the cluster's count of holders, which only a
// node joining or replacing one needs (the node-local part, Node).
func (v Verdict) OwnPodsStart() bool { return v.Node.Status == status.True }

// Ready says pods start from the set's images with the registry gone.
func (v Verdict) Ready() bool { return v.Status == status.True }

// Condition is the verdict as the set's RegistryIndependent condition (times are set
// by the caller).
func (v Verdict) Condition() status.Condition {
	return status.Condition{Type: status.ConditionRegistryIndependent, Status: v.Status, Reason: v.Reason, Message: v.Message}
}

// NodeCondition is the node-local part as the set's PodsStartWithoutRegistry
// condition (times are set by the caller).
func (v Verdict) NodeCondition() status.Condition {
	return status.Condition{Type: status.ConditionPodsStartWithoutRegistry, Status: v.Node.Status, Reason: v.Node.Reason, Message: v.Node.Message}
}

// maxNamed bounds the images or tags one line names.
const maxNamed = 5

// obstacles are what stands in the way, in order, and the first reason of each kind.
type obstacles struct {
	why          []string
	sure, unsure string
}

func (o *obstacles) add(definite bool, reason, why string) {
	o.why = append(o.why, why)
	switch {
	case definite && o.sure == "":
		o.sure = reason
	case !definite && o.unsure == "":
		o.unsure = reason
	}
}

// outcome is the status and reason: False with the first sure reason, else Unknown
// with the first unsure one, else True with ok.
func (o obstacles) outcome(ok string) (string, string) {
	switch {
	case o.sure != "":
		return status.False, o.sure
	case o.unsure != "":
		return status.Unknown, o.unsure
	}
	return status.True, ok
}

// Decide is the verdict from the facts, a pure function. Every obstacle is listed in
// Why; the reason is the first sure one in this order (False): images not present and
// pinned (NotReady), pinned tags not held (TagsNotHeld), the kubelet going to the
// registry (CredentialVerification), blobs of the images held by fewer than
// status.MinBlobHolders nodes (BlobsNotHeld); else the first that cannot be told
// (Unknown): the runtime not answering (RuntimeUnavailable), the kubelet not read yet
// (CheckingKubelet), its files unreadable (KubeletConfigUnreadable), its verification
// undecided for some image (CredentialVerification), the blobs' holders not counted
// (BlobHoldersUnknown). Never True without the cluster's count of holders. Node is the
// same without the holders: True (ImagesHeld) when this node's own pods start.
func Decide(f Facts) Verdict {
	var v Verdict
	var local obstacles

	// The images, present and pinned.
	if f.RuntimeErr != nil {
		local.add(false, status.ReasonRuntimeUnavailable, fmt.Sprintf(
			"the container runtime does not answer (%v): whether the images are present and pinned and the tags held cannot be told", f.RuntimeErr))
	} else {
		if len(f.Missing) > 0 {
			local.add(true, status.ReasonNotReady, fmt.Sprintf("%d of %d images are not on the node: %s", len(f.Missing), len(f.Images), names(f.Missing)))
		}
		if len(f.Unpinned) > 0 {
			local.add(true, status.ReasonNotReady, fmt.Sprintf("%d of %d images are present but not pinned (the kubelet's image garbage collector may remove them): %s",
				len(f.Unpinned), len(f.Images), names(f.Unpinned)))
		}
	}
	// The phase's own words, unless the images' say it better. With the runtime down the
	// images' words are not said (they cannot be told), and a sure obstacle the phase
	// names (a release that cannot be expanded, a full disk) stays a sure False.
	if (f.RuntimeErr != nil || len(f.Missing) == 0 && len(f.Unpinned) == 0) && f.NotReady != "" {
		local.add(true, status.ReasonNotReady, "not every image is present and pinned: "+f.NotReady)
	}

	// The tags pods name, held as their pinned digests.
	var notHeld []string
	for _, t := range f.Tags {
		if !f.Held[t.Name] {
			notHeld = append(notHeld, t.Name)
		}
	}
	if f.RuntimeErr == nil && len(notHeld) > 0 {
		local.add(true, status.ReasonTagsNotHeld, fmt.Sprintf("%d of %d pinned tags are not held by the runtime as their pinned digests: %s (pods naming them would need the registry)",
			len(notHeld), len(f.Tags), names(notHeld)))
	}

	// The kubelet at pod start.
	switch {
	case !f.KubeletRead:
		local.add(false, status.ReasonCheckingKubelet, "reading the kubelet's image pull credential verification")
	case f.KubeletErr != nil:
		local.add(false, status.ReasonKubeletConfigUnreadable, "cannot tell whether the kubelet verifies pull credentials at pod start: "+f.KubeletErr.Error())
	default:
		v.Policy = f.Verification.Policy
		v.Kubelet, v.KubeletDecided = f.Verification.Decide(f.Images, f.IDs), true
		switch v.Kubelet.Answer {
		case kubelet.NeedsRegistry:
			local.add(true, status.ReasonCredentialVerification, v.Kubelet.Message)
		case kubelet.Unknown:
			local.add(false, status.ReasonCredentialVerification, v.Kubelet.Message)
		}
	}

	// This node's own pods.
	v.Node.Status, v.Node.Reason = local.outcome(status.ReasonImagesHeld)
	v.Node.Why = local.why
	if v.Node.Status == status.True {
		v.Node.Message = fmt.Sprintf("%d images present and pinned", len(f.Images))
		if len(f.Tags) > 0 {
			v.Node.Message += fmt.Sprintf(", %d pinned tags held as their pinned digests", len(f.Tags))
		}
		v.Node.Message += "; " + v.Kubelet.Message
	} else {
		v.Node.Message = strings.Join(local.why, "; ")
	}

	// The cluster: every blob of the images held by enough nodes for one to be lost.
	whole := obstacles{why: slices.Clone(local.why), sure: local.sure, unsure: local.unsure}
	switch f.Holders.Status {
	case status.True:
	case status.False:
		whole.add(true, status.ReasonBlobsNotHeld, f.Holders.Why())
	default:
		whole.add(false, status.ReasonBlobHoldersUnknown, f.Holders.Why())
	}

	v.Status, v.Reason = whole.outcome(status.ReasonPodsStartWithoutRegistry)
	switch {
	case v.Status == status.True:
		v.Message = v.Node.Message + fmt.Sprintf("; each of the %d blobs of the images held by at least %d nodes", f.Holders.Blobs, status.MinBlobHolders)
	case v.Node.Status == status.True:
		// Only the cluster's count stands in the way: this node's own pods start.
		v.Why = whole.why
		v.Message = strings.Join(v.Why, "; ") +
			fmt.Sprintf("; this node's own pods start from its %d images with the registry gone (%s)", len(f.Images), v.Kubelet.Message)
	default:
		v.Why = whole.why
		v.Message = strings.Join(v.Why, "; ")
	}
	return v
}

// HeldTags says, by name, which of tags the runtime holds as their pinned digests:
// listed (CRI ListImages: name as the runtime spells it → image ID) names the tag with
// the image ID of its pinned digest. A tag the runtime took from elsewhere (a registry
// where it moved) is listed with another ID, and is not held; nor is a tag the runtime
// holds only in another case (a pod naming :V1 does not find :v1).
func HeldTags(tags []pinset.Tag, listed map[string]string) map[string]bool {
	held := map[string]bool{}
	for _, t := range tags {
		id := listed[t.Name]
		held[t.Name] = id != "" && id == listed[t.Image]
	}
	return held
}

// names lists up to maxNamed entries in order and counts the rest.
func names(items []string) string {
	items = append([]string(nil), items...)
	sort.Strings(items)
	if len(items) <= maxNamed {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:maxNamed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxNamed)
}
