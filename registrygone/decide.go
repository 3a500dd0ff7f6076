package registrygone

import (
	"fmt"
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
	// Policy is the kubelet's imagePullCredentialsVerificationPolicy in effect ("" when
	// its files were not read).
	Policy string
	// Kubelet is the kubelet's own answer for the images (its Needs and Unsure);
	// KubeletDecided false when its files were not read.
	Kubelet        kubelet.Decision
	KubeletDecided bool
	// OwnPodsStart says this node's own pods start from the images with the registry
	// gone: nothing stands in the way but, perhaps, the cluster's count of holders,
	// which only a node joining or replacing one needs.
	OwnPodsStart bool
}

// Ready says pods start from the set's images with the registry gone.
func (v Verdict) Ready() bool { return v.Status == status.True }

// Condition is the verdict as the set's RegistryIndependent condition (times are set
// by the caller).
func (v Verdict) Condition() status.Condition {
	return status.Condition{Type: status.ConditionRegistryIndependent, Status: v.Status, Reason: v.Reason, Message: v.Message}
}

// maxNamed bounds the images or tags one line names.
const maxNamed = 5

// Decide is the verdict from the facts, a pure function. Every obstacle is listed in
// Why; the reason is the first sure one in this order (False): images not present and
// pinned (NotReady), pinned tags not held (TagsNotHeld), the kubelet going to the
// registry (CredentialVerification), blobs of the images held by fewer than
// status.MinBlobHolders nodes (BlobsNotHeld); else the first that cannot be told
// (Unknown): the runtime not answering (RuntimeUnavailable), the kubelet not read yet
// (CheckingKubelet), its files unreadable (KubeletConfigUnreadable), its verification
// undecided for some image (CredentialVerification), the blobs' holders not counted
// (BlobHoldersUnknown). Never True without the cluster's count of holders.
func Decide(f Facts) Verdict {
	var v Verdict
	var sure, unsure string // the first reason of each kind
	add := func(definite bool, reason, why string) {
		v.Why = append(v.Why, why)
		switch {
		case definite && sure == "":
			sure = reason
		case !definite && unsure == "":
			unsure = reason
		}
	}

	// The images, present and pinned.
	if f.RuntimeErr != nil {
		add(false, status.ReasonRuntimeUnavailable, fmt.Sprintf(
			"the container runtime does not answer (%v): whether the images are present and pinned and the tags held cannot be told", f.RuntimeErr))
	} else {
		if len(f.Missing) > 0 {
			add(true, status.ReasonNotReady, fmt.Sprintf("%d of %d images are not on the node: %s", len(f.Missing), len(f.Images), names(f.Missing)))
		}
		if len(f.Unpinned) > 0 {
			add(true, status.ReasonNotReady, fmt.Sprintf("%d of %d images are present but not pinned (the kubelet's image garbage collector may remove them): %s",
				len(f.Unpinned), len(f.Images), names(f.Unpinned)))
		}
	}
	// The phase's own words, unless the images' say it better. With the runtime down the
	// images' words are not said (they cannot be told), and a sure obstacle the phase
	// names (a release that cannot be expanded, a full disk) stays a sure False.
	if (f.RuntimeErr != nil || len(f.Missing) == 0 && len(f.Unpinned) == 0) && f.NotReady != "" {
		add(true, status.ReasonNotReady, "not every image is present and pinned: "+f.NotReady)
	}

	// The tags pods name, held as their pinned digests.
	var notHeld []string
	for _, t := range f.Tags {
		if !f.Held[t.Name] {
			notHeld = append(notHeld, t.Name)
		}
	}
	if f.RuntimeErr == nil && len(notHeld) > 0 {
		add(true, status.ReasonTagsNotHeld, fmt.Sprintf("%d of %d pinned tags are not held by the runtime as their pinned digests: %s (pods naming them would need the registry)",
			len(notHeld), len(f.Tags), names(notHeld)))
	}

	// The kubelet at pod start.
	switch {
	case !f.KubeletRead:
		add(false, status.ReasonCheckingKubelet, "reading the kubelet's image pull credential verification")
	case f.KubeletErr != nil:
		add(false, status.ReasonKubeletConfigUnreadable, "cannot tell whether the kubelet verifies pull credentials at pod start: "+f.KubeletErr.Error())
	default:
		v.Policy = f.Verification.Policy
		v.Kubelet, v.KubeletDecided = f.Verification.Decide(f.Images, f.IDs), true
		switch v.Kubelet.Answer {
		case kubelet.NeedsRegistry:
			add(true, status.ReasonCredentialVerification, v.Kubelet.Message)
		case kubelet.Unknown:
			add(false, status.ReasonCredentialVerification, v.Kubelet.Message)
		}
	}

	// The cluster: every blob of the images held by enough nodes for one to be lost.
	v.OwnPodsStart = len(v.Why) == 0
	switch f.Holders.Status {
	case status.True:
	case status.False:
		add(true, status.ReasonBlobsNotHeld, f.Holders.Why())
	default:
		add(false, status.ReasonBlobHoldersUnknown, f.Holders.Why())
	}

	switch {
	case sure != "":
		v.Status, v.Reason = status.False, sure
	case unsure != "":
		v.Status, v.Reason = status.Unknown, unsure
	default:
		v.Status, v.Reason = status.True, status.ReasonPodsStartWithoutRegistry
		v.Message = fmt.Sprintf("%d images present and pinned", len(f.Images))
		if len(f.Tags) > 0 {
			v.Message += fmt.Sprintf(", %d pinned tags held as their pinned digests", len(f.Tags))
		}
		v.Message += "; " + v.Kubelet.Message
		v.Message += fmt.Sprintf("; each of the %d blobs of the images held by at least %d nodes", f.Holders.Blobs, status.MinBlobHolders)
		return v
	}
	v.Message = strings.Join(v.Why, "; ")
	if len(v.Why) == 1 && (v.Reason == status.ReasonBlobsNotHeld || v.Reason == status.ReasonBlobHoldersUnknown) {
		// Only the cluster's count stands in the way: this node's own pods start.
		v.Message += fmt.Sprintf("; this node's own pods start from its %d images with the registry gone (%s)", len(f.Images), v.Kubelet.Message)
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
