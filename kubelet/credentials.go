package kubelet

import (
	"fmt"
	"sort"
	"strings"

	"github.com/distribution/reference"
)

// The kubelet's image pull credential verification policies
// (KubeletConfiguration.imagePullCredentialsVerificationPolicy).
const (
	NeverVerify                  = "NeverVerify"
	NeverVerifyPreloadedImages   = "NeverVerifyPreloadedImages"
	NeverVerifyAllowlistedImages = "NeverVerifyAllowlistedImages"
	AlwaysVerify                 = "AlwaysVerify"
)

// FeatureGate turns the verification on: alpha and off by default in Kubernetes 1.33
// and 1.34, beta and on by default from 1.35 (pkg/features/kube_features.go:
// KubeletEnsureSecretPulledImages {1.33 Default false Alpha}, {1.35 Default true Beta});
// before 1.33 it does not exist.
const FeatureGate = "KubeletEnsureSecretPulledImages"

// GateState is what is known of the feature gate of the kubelet that will start the pods.
type GateState int

const (
	GateUnknown GateState = iota
	GateOff
	GateOn
)

// Verification is what the kubelet does, at pod start, with an image already on the
// node: whether it checks the pod's credentials against the registry first.
type Verification struct {
	// Gate: whether the kubelet verifies at all (the feature gate); Why says how that was
	// decided.
	Gate GateState
	Why  string
	// Policy is the effective policy, its default applied.
	Policy    string
	Allowlist []string
	Records   PullRecords
	// naming is how the kubelet names images (its version's); allow is the allowlist as
	// that kubelet matches it, by naming (both when the version is not known).
	naming naming
	allow  map[naming]allowlist
}

// naming is how the kubelet names an image in its pull records (the key of a record's
// credentialMapping) and matches it against preloadedImagesVerificationAllowlist.
// Kubernetes 1.36 changed both (pkg/kubelet/images/pullmanager, trimImageTagDigest).
type naming int

const (
	// namingNotKnown: the kubelet's version is not known. Both namings are followed, and
	// an image whose answer differs between them is Unknown.
	namingNotKnown naming = iota
	// naming135 (the kubelet 1.33 to 1.35): the record's key is the image's name
	// normalized (parsers.ParseImageName: docker.io/busybox:1 is
	// docker.io/library/busybox); the allowlist is compared with the image as the pod
	// writes it, tag and digest included, and an entry must be fully qualified.
	naming135
	// naming136 (the kubelet 1.36 and later): the image as the pod writes it, its tag and
	// digest cut off and nothing added (docker.io/busybox:1 is docker.io/busybox), for
	// the record's key and the allowlist alike; an entry need not be fully qualified.
	naming136
)

// namingOf is the naming of the kubelet of that version.
func namingOf(version Version) naming {
	switch {
	case !version.Known():
		return namingNotKnown
	case version.atLeast(1, 36):
		return naming136
	}
	return naming135
}

func (n naming) String() string {
	if n == naming136 {
		return "a kubelet of 1.36 or later"
	}
	return "a kubelet before 1.36"
}

// gate decides the feature gate, in this order: an entry in the config's featureGates
// (the kubelet's own setting); a kubelet of 1.35 or later (on by default); pull records
// (the kubelet creates <root-dir>/image_manager at start only with the gate on, so it has
// run with it on); a kubelet before 1.35 (off by default). Else it is not known: a node
// whose kubelet has not started yet and whose version cannot be read. A gate set on the
// kubelet's command line (--feature-gates) is not seen.
func gate(c Config, records PullRecords, version Version) (GateState, string) {
	if on, set := c.FeatureGates[FeatureGate]; set {
		if on {
			return GateOn, fmt.Sprintf("featureGates.%s: true in the kubelet config", FeatureGate)
		}
		return GateOff, fmt.Sprintf("featureGates.%s: false in the kubelet config", FeatureGate)
	}
	switch {
	case version.Known() && version.atLeast(1, 35):
		return GateOn, fmt.Sprintf("kubelet %s (%s): %s is on by default from Kubernetes 1.35", version.Text, version.From, FeatureGate)
	case records.Enabled:
		return GateOn, "the kubelet keeps pull records (image_manager), so it runs with " + FeatureGate + " on"
	case version.Known():
		return GateOff, fmt.Sprintf("kubelet %s (%s): %s is off by default before Kubernetes 1.35 and not set in the kubelet config", version.Text, version.From, FeatureGate)
	}
	why := "not set in the kubelet config, no pull records (image_manager) yet (the kubelet has not started with it on)"
	if version.From != "" {
		why += ", and the kubelet's version is not known (" + version.From + ")"
	} else {
		why += ", and the kubelet's version is not known"
	}
	return GateUnknown, "whether " + FeatureGate + " is on cannot be told: " + why
}

// NewVerification puts the config, the records and the kubelet's version (Version{} when
// not known) together.
func NewVerification(c Config, records PullRecords, version Version) (Verification, error) {
	v := Verification{Policy: c.ImagePullCredentialsVerificationPolicy, Allowlist: c.PreloadedImagesVerificationAllowlist, Records: records, naming: namingOf(version)}
	v.Gate, v.Why = gate(c, records, version)
	if v.Policy == "" {
		v.Policy = NeverVerifyPreloadedImages
	}
	switch v.Policy {
	case NeverVerify, NeverVerifyPreloadedImages, AlwaysVerify:
	case NeverVerifyAllowlistedImages:
		a135, err135 := newAllowlist(v.Allowlist, naming135)
		a136, err136 := newAllowlist(v.Allowlist, naming136)
		switch {
		case v.naming == naming135 && err135 != nil:
			return v, fmt.Errorf("preloadedImagesVerificationAllowlist: %w (kubelet %s refuses it too)", err135, version.Text)
		case v.naming == naming136 && err136 != nil:
			return v, fmt.Errorf("preloadedImagesVerificationAllowlist: %w (kubelet %s refuses it too)", err136, version.Text)
		case err135 != nil && err136 != nil:
			return v, fmt.Errorf("preloadedImagesVerificationAllowlist: %w", err135)
		case v.naming == namingNotKnown && err135 != nil:
			// A kubelet before 1.36 refuses this allowlist and does not start: the one
			// that runs is 1.36 or later.
			v.naming = naming136
		case v.naming == namingNotKnown && err136 != nil:
			v.naming = naming135
		}
		v.allow = map[naming]allowlist{naming135: a135, naming136: a136}
	default:
		return v, fmt.Errorf("imagePullCredentialsVerificationPolicy %q: not a policy the kubelet knows (%s, %s, %s, %s)",
			v.Policy, NeverVerify, NeverVerifyPreloadedImages, NeverVerifyAllowlistedImages, AlwaysVerify)
	}
	return v, nil
}

// Answer is whether pods start from an image (or from every image of a set) already on
// the node with the registry gone.
type Answer int

const (
	// Unknown: what the kubelet does cannot be told from what imagepind can read (the
	// zero value: nothing is called Starts without being decided so).
	Unknown Answer = iota
	// Starts: the kubelet lets pods use the image without going to the registry.
	Starts
	// NeedsRegistry: the kubelet goes to the registry before a pod may use it.
	NeedsRegistry
)

func (a Answer) String() string {
	switch a {
	case Starts:
		return "Starts"
	case NeedsRegistry:
		return "NeedsRegistry"
	}
	return "Unknown"
}

// image says whether a pod using image (as written in its spec), already on the node as
// image ID id, makes the kubelet go to the registry first, and why. It follows the
// kubelet's PullManager.MustAttemptImagePull (pkg/kubelet/images/pullmanager/
// image_pull_manager.go): a record of the image it cannot read sends it to the registry
// whatever the policy; else the policy decides whether to verify (given whether the
// kubelet pulled the image itself); a verification is passed without the registry only
// by a record of the kubelet's own pull that lets every pod use the image (pulled
// without credentials). A record with a pod's secret or service account lets pods with
// the same credentials through: that depends on the pod, so it is counted as needing the
// registry, and said.
func (v Verification) image(image, id string) (Answer, string) {
	if v.Gate == GateOff {
		return Starts, ""
	}
	a, why := v.verified(image, id)
	if a == NeedsRegistry && v.Gate == GateUnknown {
		return Unknown, why + ", if " + FeatureGate + " is on"
	}
	return a, why
}

// verified is the answer with the feature gate on, for the kubelet's naming; when its
// version is not known, the answer of both namings where they agree, else Unknown.
func (v Verification) verified(image, id string) (Answer, string) {
	if v.naming != namingNotKnown {
		return v.verifiedAs(v.naming, image, id)
	}
	a, why := v.verifiedAs(naming135, image, id)
	b, whyB := v.verifiedAs(naming136, image, id)
	if a == b {
		return a, why
	}
	return Unknown, fmt.Sprintf("%s %s, %s %s (they name images differently), and the kubelet's version is not known",
		naming135, sayAnswer(a, why), naming136, sayAnswer(b, whyB))
}

// sayAnswer says an answer with why, for a sentence about what a kubelet does.
func sayAnswer(a Answer, why string) string {
	switch a {
	case Starts:
		return "lets pods use it without the registry"
	case NeedsRegistry:
		return "goes to the registry for it (" + why + ")"
	}
	return "cannot be told (" + why + ")"
}

// verifiedAs is the answer with the feature gate on, for a kubelet that names images so.
func (v Verification) verifiedAs(n naming, image, id string) (Answer, string) {
	// As the kubelet: the pulled record by image ID first, the pull intent by image
	// name only when there is no pulled record.
	var rec PulledRecord
	pulled := false
	if id != "" {
		if u, bad := v.Records.Unreadable["pulled/"+recordFile(id)]; bad {
			return unreadable(u)
		}
		rec, pulled = v.Records.Pulled[id]
	}
	intent := false
	if !pulled {
		if u, bad := v.Records.Unreadable["pulling/"+recordFile(image)]; bad {
			return unreadable(u)
		}
		intent = v.Records.Pulling[image]
	}
	byKubelet := pulled || intent
	var verify bool
	var why string
	switch v.Policy {
	case NeverVerify:
		return Starts, ""
	case NeverVerifyPreloadedImages:
		verify = byKubelet
		why = "the kubelet pulled it itself, so it is not pre-loaded any more"
		if !pulled {
			why = "the kubelet began a pull of it, so it is not pre-loaded any more"
		}
	case NeverVerifyAllowlistedImages:
		verify = !v.allow[n].matches(image)
		why = "not in preloadedImagesVerificationAllowlist"
	case AlwaysVerify:
		verify, why = true, "AlwaysVerify checks every pod's credentials"
	default: // a Verification not made by NewVerification
		return Unknown, fmt.Sprintf("imagePullCredentialsVerificationPolicy %q not known", v.Policy)
	}
	if !verify {
		return Starts, ""
	}
	if !pulled {
		return NeedsRegistry, why
	}
	name, err := imageName(image, n)
	if err != nil {
		return NeedsRegistry, why
	}
	creds, ok := rec.CredentialMapping[name]
	if ok && creds.NodePodsAccessible {
		return Starts, ""
	}
	if ok && (len(creds.KubernetesSecrets) > 0 || len(creds.KubernetesServiceAccounts) > 0) {
		return NeedsRegistry, why + "; pods with the pull secret or service account it was pulled with are let through"
	}
	return NeedsRegistry, why
}

// unreadable is the answer for an image whose record cannot be read.
func unreadable(u Unreadable) (Answer, string) {
	if u.KubeletFails {
		return NeedsRegistry, fmt.Sprintf("the kubelet cannot read its pull record of it either (%s: %s), so it goes to the registry whatever the policy", u.Path, u.Err)
	}
	return Unknown, fmt.Sprintf("its pull record %s cannot be read here (%s)", u.Path, u.Err)
}

// imageName is the key of an image in a pull record's credentialMapping: for a kubelet
// before 1.36 the reference without tag or digest, normalized as its
// parsers.ParseImageName does (docker.io/library/ added); from 1.36 the image as written
// with its tag and digest cut off (trimImageTagDigest).
func imageName(image string, n naming) (string, error) {
	if n == naming136 {
		return trimTagDigest(image)
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", err
	}
	return named.Name(), nil
}

// trimTagDigest is the kubelet 1.36's trimImageTagDigest
// (pkg/kubelet/images/pullmanager/image_pull_policies.go): the reference parsed as
// written, not normalized, and its digest then its tag cut off its end.
func trimTagDigest(image string) (string, error) {
	parsed, err := reference.Parse(image)
	if err != nil {
		return "", err
	}
	var tag, digest string
	if tagged, ok := parsed.(reference.Tagged); ok {
		tag = tagged.Tag()
	}
	if digested, ok := parsed.(reference.Digested); ok {
		digest = digested.Digest().String()
	}
	if digest != "" {
		var found bool
		if image, found = strings.CutSuffix(image, "@"+digest); !found {
			return "", fmt.Errorf("digest was not specified last, this does not appear to be a valid image spec: %q", image)
		}
	}
	if tag != "" {
		var found bool
		if image, found = strings.CutSuffix(image, ":"+tag); !found {
			return "", fmt.Errorf("tag %q was not specified last (or before the digest), this does not appear to be a valid image spec: %q", tag, image)
		}
	}
	return image, nil
}

// allowlist is preloadedImagesVerificationAllowlist as the kubelet matches it
// (pkg/kubelet/images/pullmanager/image_pull_policies.go): an entry is an image name
// without tag or digest, or a prefix ending in "/*". A kubelet before 1.36 compares the
// pod's image string as written, so an image written with a tag or digest matches only a
// prefix; from 1.36 it compares the image with its tag and digest cut off.
type allowlist struct {
	exact    map[string]bool
	prefixes []string
	naming   naming
}

func newAllowlist(patterns []string, n naming) (allowlist, error) {
	a := allowlist{exact: map[string]bool{}, naming: n}
	for _, p := range patterns {
		if p != strings.TrimSpace(p) {
			return a, fmt.Errorf("%q: leading/trailing spaces are not allowed", p)
		}
		trimmed, wildcard := p, strings.HasSuffix(p, "/*")
		if wildcard {
			trimmed = strings.TrimSuffix(p, "*")
		}
		switch {
		case trimmed == "":
			return a, fmt.Errorf("%q: too short", p)
		case strings.ContainsRune(trimmed, '*'):
			return a, fmt.Errorf("%q: only patterns ending with '/*' are allowed", p)
		case wildcard && len(trimmed) == 1:
			return a, fmt.Errorf("%q: at least a registry host name is required", p)
		case wildcard:
			a.prefixes = append(a.prefixes, trimmed)
		case n == naming136:
			name, err := trimTagDigest(trimmed)
			if err != nil {
				return a, fmt.Errorf("%q: not an image name: %w", p, err)
			}
			if trimmed != name {
				return a, fmt.Errorf("%q: neither tag nor digest is accepted", p)
			}
			a.exact[trimmed] = true
		default:
			named, err := reference.ParseNormalizedNamed(trimmed)
			if err != nil {
				return a, fmt.Errorf("%q: not an image name: %w", p, err)
			}
			if trimmed != named.Name() {
				return a, fmt.Errorf("%q: neither tag nor digest is accepted (and the name must be fully qualified)", p)
			}
			a.exact[trimmed] = true
		}
	}
	return a, nil
}

func (a allowlist) matches(image string) bool {
	if a.naming == naming136 {
		// As the kubelet: an image that does not parse is matched as written.
		if name, err := trimTagDigest(image); err == nil {
			image = name
		}
	}
	if a.exact[image] {
		return true
	}
	for _, p := range a.prefixes {
		if strings.HasPrefix(image, p) {
			return true
		}
	}
	return false
}

// Need is one image whose pods need the registry at pod start (or may: Decision.Unsure),
// and why.
type Need struct {
	Image, Why string
}

// Decision is whether pods start from a set's images with the registry gone: Starts only
// when they start from every image; NeedsRegistry when the kubelet goes to the registry
// for one at least; else Unknown.
type Decision struct {
	Answer Answer
	// Needs are the images the kubelet goes to the registry for, Unsure those for which
	// it cannot be told; both in name order.
	Needs, Unsure []Need
	// Message says it in a line, naming up to 5 images with why.
	Message string
}

// Decide answers for the images refs. listed maps the runtime's image names, as it spells
// them, to their IDs (CRI ListImages; the kubelet asks the runtime for the ID by the
// image's name as written); an image not listed has no ID, so no pull record of the
// kubelet's can match it. The daemon's RegistryIndependent condition and imagepinctl
// check --registry-gone both take this answer.
func (v Verification) Decide(refs []string, listed map[string]string) Decision {
	var d Decision
	for _, ref := range refs {
		switch a, why := v.image(ref, listed[ref]); a {
		case NeedsRegistry:
			d.Needs = append(d.Needs, Need{Image: ref, Why: why})
		case Unknown:
			d.Unsure = append(d.Unsure, Need{Image: ref, Why: why})
		}
	}
	byImage := func(n []Need) { sort.Slice(n, func(i, j int) bool { return n[i].Image < n[j].Image }) }
	byImage(d.Needs)
	byImage(d.Unsure)
	const max = 5
	policy := "imagePullCredentialsVerificationPolicy " + v.Policy
	switch {
	case len(d.Needs) > 0:
		d.Answer = NeedsRegistry
		d.Message = fmt.Sprintf("%s: %d of %d images need the registry when a pod starts: %s", policy, len(d.Needs), len(refs), list(d.Needs, max))
		if len(d.Unsure) > 0 {
			d.Message += fmt.Sprintf("; for %d more it cannot be told: %s", len(d.Unsure), list(d.Unsure, max))
		}
	case len(d.Unsure) > 0:
		d.Answer = Unknown
		d.Message = fmt.Sprintf("%s: for %d of %d images it cannot be told whether pods start from them without the registry: %s", policy, len(d.Unsure), len(refs), list(d.Unsure, max))
		if v.Gate == GateUnknown {
			d.Message += "; " + v.Why
		}
	case v.Gate == GateOff:
		d.Answer = Starts
		d.Message = "the kubelet does not verify pull credentials of images on the node (" + v.Why + ")"
	default:
		d.Answer = Starts
		d.Message = fmt.Sprintf("%s: pods start from these %d images without the registry", policy, len(refs))
		if v.Gate == GateUnknown {
			d.Message += ", whether " + FeatureGate + " is on or off (" + v.Why + ")"
		}
		if n := len(v.Records.Unreadable); n > 0 {
			d.Message += fmt.Sprintf(" (%d of the kubelet's pull records cannot be read, none of them one of these images', e.g. %s)", n, v.Records.someUnreadable())
		}
	}
	return d
}

// someUnreadable names the first unreadable record, by path.
func (r PullRecords) someUnreadable() string {
	var first Unreadable
	for _, u := range r.Unreadable {
		if first.Path == "" || u.Path < first.Path {
			first = u
		}
	}
	return first.Path + ": " + first.Err
}

// list names up to max needs, with why, and how many more.
func list(needs []Need, max int) string {
	names := make([]string, 0, max+1)
	for i, n := range needs {
		if i == max {
			names = append(names, fmt.Sprintf("and %d more", len(needs)-max))
			break
		}
		names = append(names, n.Image+" ("+n.Why+")")
	}
	return strings.Join(names, "; ")
}
