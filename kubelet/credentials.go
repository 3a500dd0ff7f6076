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

// FeatureGate turns the verification on (beta, on by default, from Kubernetes 1.35).
const FeatureGate = "KubeletEnsureSecretPulledImages"

// Verification is what the kubelet does, at pod start, with an image already on the
// node: whether it checks the pod's credentials against the registry first.
type Verification struct {
	// On: the kubelet verifies at all (the feature gate); Why says how that was decided.
	On  bool
	Why string
	// Policy is the effective policy, its default applied.
	Policy    string
	Allowlist []string
	allow     allowlist
	Records   PullRecords
}

// NewVerification puts the config and the records together. The feature gate is taken
// from the config when set there, else from the records directory: the kubelet creates
// <root-dir>/image_manager at start only with the gate on (1.35 and later by default).
func NewVerification(c Config, records PullRecords) (Verification, error) {
	v := Verification{Policy: c.ImagePullCredentialsVerificationPolicy, Allowlist: c.PreloadedImagesVerificationAllowlist, Records: records}
	gate, set := c.FeatureGates[FeatureGate]
	switch {
	case set:
		v.On, v.Why = gate, fmt.Sprintf("featureGates.%s: %v in the kubelet config", FeatureGate, gate)
	case records.Enabled:
		v.On, v.Why = true, "the kubelet keeps pull records (image_manager), so "+FeatureGate+" is on (the default from Kubernetes 1.35)"
	default:
		v.Why = "no pull records (image_manager) under the kubelet's root directory: " + FeatureGate + " is off (the default before Kubernetes 1.35), or the kubelet has not started yet"
	}
	if v.Policy == "" {
		v.Policy = NeverVerifyPreloadedImages
	}
	switch v.Policy {
	case NeverVerify, NeverVerifyPreloadedImages, AlwaysVerify:
	case NeverVerifyAllowlistedImages:
		a, err := newAllowlist(v.Allowlist)
		if err != nil {
			return v, fmt.Errorf("preloadedImagesVerificationAllowlist: %w", err)
		}
		v.allow = a
	default:
		return v, fmt.Errorf("imagePullCredentialsVerificationPolicy %q: not a policy the kubelet knows (%s, %s, %s, %s)",
			v.Policy, NeverVerify, NeverVerifyPreloadedImages, NeverVerifyAllowlistedImages, AlwaysVerify)
	}
	return v, nil
}

// NeedsRegistry says whether a pod using image (as written in its spec), already on the
// node as image ID id, makes the kubelet go to the registry first, and why. It follows
// the kubelet's PullManager.MustAttemptImagePull: the policy decides whether to verify
// (given whether the kubelet pulled the image itself); a verification is passed without
// the registry only by a record of the kubelet's own pull that lets every pod use the
// image (pulled without credentials). A record with a pod's secret or service account
// lets pods with the same credentials through: that depends on the pod, so it is counted
// as needing the registry, and said.
func (v Verification) NeedsRegistry(image, id string) (bool, string) {
	if !v.On {
		return false, ""
	}
	rec, pulled := v.Records.Pulled[id]
	byKubelet := pulled || v.Records.Pulling[image]
	var verify bool
	var why string
	switch v.Policy {
	case NeverVerify:
		return false, ""
	case NeverVerifyPreloadedImages:
		verify = byKubelet
		why = "the kubelet pulled it itself, so it is not pre-loaded any more"
		if !pulled {
			why = "the kubelet began a pull of it, so it is not pre-loaded any more"
		}
	case NeverVerifyAllowlistedImages:
		verify = !v.allow.matches(image)
		why = "not in preloadedImagesVerificationAllowlist"
	case AlwaysVerify:
		verify, why = true, "AlwaysVerify checks every pod's credentials"
	}
	if !verify {
		return false, ""
	}
	if !pulled {
		return true, why
	}
	name, err := imageName(image)
	if err != nil {
		return true, why
	}
	creds, ok := rec.CredentialMapping[name]
	if ok && creds.NodePodsAccessible {
		return false, ""
	}
	if ok && (len(creds.KubernetesSecrets) > 0 || len(creds.KubernetesServiceAccounts) > 0) {
		return true, why + "; pods with the pull secret or service account it was pulled with are let through"
	}
	return true, why
}

// imageName is an image reference without tag or digest, normalized as the kubelet's
// parsers.ParseImageName does (docker.io/library/ added).
func imageName(image string) (string, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", err
	}
	return named.Name(), nil
}

// allowlist is preloadedImagesVerificationAllowlist as the kubelet matches it
// (pkg/kubelet/images/pullmanager/image_pull_policies.go): an entry is an image name
// without tag or digest, compared with the pod's image string as written, or a prefix
// ending in "/*". A pod image written with a tag or digest matches only a prefix.
type allowlist struct {
	exact    map[string]bool
	prefixes []string
}

func newAllowlist(patterns []string) (allowlist, error) {
	a := allowlist{exact: map[string]bool{}}
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

// Need is one image that needs the registry at pod start, and why.
type Need struct {
	Image, Why string
}

// Needs are the images of refs that need the registry at pod start, in name order.
// listed maps the runtime's image names, lower-cased, to their IDs (CRI ListImages);
// an image not listed has no ID, so no pull record of the kubelet's can match it.
func (v Verification) Needs(refs []string, listed map[string]string) []Need {
	var out []Need
	for _, ref := range refs {
		if need, why := v.NeedsRegistry(ref, listed[strings.ToLower(ref)]); need {
			out = append(out, Need{Image: ref, Why: why})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Image < out[j].Image })
	return out
}

// Summary is one line for a condition message: the policy and how many of total images
// need the registry, naming up to max of them.
func (v Verification) Summary(needs []Need, total, max int) string {
	if len(needs) == 0 {
		if !v.On {
			return "the kubelet does not verify pull credentials of images on the node (" + v.Why + ")"
		}
		return fmt.Sprintf("imagePullCredentialsVerificationPolicy %s: pods start from these %d images without the registry", v.Policy, total)
	}
	names := make([]string, 0, max)
	for i, n := range needs {
		if i == max {
			names = append(names, fmt.Sprintf("and %d more", len(needs)-max))
			break
		}
		names = append(names, n.Image+" ("+n.Why+")")
	}
	return fmt.Sprintf("imagePullCredentialsVerificationPolicy %s: %d of %d images need the registry when a pod starts: %s",
		v.Policy, len(needs), total, strings.Join(names, "; "))
}
