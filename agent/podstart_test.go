package agent

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/registrygone"
	"github.com/imagepin/imagepin/status"
)

func TestRegistryCondition(t *testing.T) {
	const a, b = "reg.example/team/a@sha256:1111111111111111111111111111111111111111111111111111111111111111",
		"reg.example/other/b@sha256:2222222222222222222222222222222222222222222222222222222222222222"
	refs := []string{a, b}
	ready := phaseOutcome{Phase: status.Ready, Reason: status.ReasonAllImagesPinned, Message: "2 images present and pinned"}
	verification := func(c kubelet.Config) kubelet.Verification {
		c.FeatureGates = map[string]bool{kubelet.FeatureGate: true}
		v, err := kubelet.NewVerification(c, kubelet.PullRecords{Enabled: true}, kubelet.Version{})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// No featureGates entry, no pull records yet, no version: the gate is not known.
	notStarted := func(policy string) kubelet.Verification {
		v, err := kubelet.NewVerification(kubelet.Config{ImagePullCredentialsVerificationPolicy: policy}, kubelet.PullRecords{}, kubelet.Version{})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	known := func(v kubelet.Verification) podStart { return podStart{v: v, known: true, ids: map[string]string{}} }
	// The kubelet's record of its pull of a (as image ID "id-a") cannot be read.
	root := t.TempDir()
	record := filepath.Join(root, "image_manager", "pulled", fmt.Sprintf("sha256-%x", sha256.Sum256([]byte("id-a"))))
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	broken, err := kubelet.ReadPullRecords(root)
	if err != nil {
		t.Fatal(err)
	}
	brokenRecord, err := kubelet.NewVerification(kubelet.Config{FeatureGates: map[string]bool{kubelet.FeatureGate: true}}, broken, kubelet.Version{})
	if err != nil {
		t.Fatal(err)
	}
	tag := pinset.Tag{Name: "reg.example/team/a:v2", Image: a}
	images := registrygone.Facts{Images: refs, Holders: everyBlobHeld{}.Holders("")}
	with := func(mod func(*registrygone.Facts)) registrygone.Facts {
		f := images
		mod(&f)
		return f
	}
	cases := []struct {
		name   string
		o      phaseOutcome
		ps     podStart
		f      registrygone.Facts
		status string
		reason string
		msg    string
	}{
		{"not ready", phaseOutcome{Phase: status.Pulling, Message: "1/2 images ready"}, known(verification(kubelet.Config{})),
			with(func(f *registrygone.Facts) { f.Missing = []string{b} }), status.False, status.ReasonNotReady, "1 of 2 images are not on the node: " + b},
		{"not ready, every image present", phaseOutcome{Phase: status.Pending, Reason: status.ReasonWaitingForReload, Message: "pins written; waiting for CRI-O to have them in effect"},
			known(verification(kubelet.Config{})), images, status.False, status.ReasonNotReady, "not every image is present and pinned: pins written; waiting for CRI-O"},
		{"the runtime does not answer", phaseOutcome{Phase: status.Pending, Reason: status.ReasonRuntimeUnavailable, Message: "container runtime unavailable; retrying"},
			known(verification(kubelet.Config{})), with(func(f *registrygone.Facts) { f.RuntimeErr = errors.New("connection refused") }),
			status.Unknown, status.ReasonRuntimeUnavailable, "the container runtime does not answer (connection refused)"},
		{"a pinned tag not held", ready, known(verification(kubelet.Config{})), with(func(f *registrygone.Facts) { f.Tags = []pinset.Tag{tag} }),
			status.False, status.ReasonTagsNotHeld, tagNotHeld},
		{"a pinned tag held", ready, known(verification(kubelet.Config{})),
			with(func(f *registrygone.Facts) { f.Tags, f.Held = []pinset.Tag{tag}, map[string]bool{tag.Name: true} }),
			status.True, status.ReasonPodsStartWithoutRegistry, "1 pinned tags held as their pinned digests"},
		{"kubelet not read yet", ready, podStart{}, images, status.Unknown, status.ReasonCheckingKubelet, ""},
		{"kubelet config unreadable", ready, podStart{known: true, err: errors.New("kubelet drop-in /x.conf: no apiVersion/kind")}, images, status.Unknown, status.ReasonKubeletConfigUnreadable, "/x.conf"},
		{"default policy: pre-loaded", ready, known(verification(kubelet.Config{})), images, status.True, status.ReasonPodsStartWithoutRegistry, "NeverVerifyPreloadedImages: pods start from these 2 images"},
		{"a record the kubelet cannot read", ready, podStart{v: brokenRecord, known: true, ids: map[string]string{a: "id-a"}}, images, status.False, status.ReasonCredentialVerification,
			"1 of 2 images need the registry when a pod starts: " + a + " (the kubelet cannot read its pull record of it either (" + record},
		{"kubelet not started yet, its version not known: AlwaysVerify", ready, podStart{v: notStarted(kubelet.AlwaysVerify), known: true}, images, status.Unknown, status.ReasonCredentialVerification,
			"whether KubeletEnsureSecretPulledImages is on cannot be told"},
		{"kubelet not started yet, its version not known: default policy", ready, podStart{v: notStarted(""), known: true}, images, status.True, status.ReasonPodsStartWithoutRegistry,
			"whether KubeletEnsureSecretPulledImages is on or off"},
		{"AlwaysVerify", ready, known(verification(kubelet.Config{ImagePullCredentialsVerificationPolicy: kubelet.AlwaysVerify})), images, status.False, status.ReasonCredentialVerification, "AlwaysVerify: 2 of 2 images need the registry"},
		{"allowlist names the others", ready, known(verification(kubelet.Config{ImagePullCredentialsVerificationPolicy: kubelet.NeverVerifyAllowlistedImages,
			PreloadedImagesVerificationAllowlist: []string{"reg.example/team/*"}})), images, status.False, status.ReasonCredentialVerification, "1 of 2 images need the registry when a pod starts: " + b},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conds := registryConditions(c.o, c.ps, c.f)
			got := conds[0]
			if node := conds[1]; node.Type != status.ConditionPodsStartWithoutRegistry || (node.Status == status.True) != (got.Status == status.True) {
				// Every count of holders here is True: the node's part is the whole.
				t.Fatalf("the node-local part %+v with %+v", node, got)
			}
			if got.Type != status.ConditionRegistryIndependent || got.Status != c.status || got.Reason != c.reason || !strings.Contains(got.Message, c.msg) {
				t.Fatalf("got %s/%s %q; want %s/%s containing %q", got.Status, got.Reason, got.Message, c.status, c.reason, c.msg)
			}
		})
	}
}

// tagNotHeld is what imagepind and imagepinctl check --registry-gone both say of
// reg.example/team/a:v2 when the runtime does not hold it as its pinned digest.
const tagNotHeld = "1 of 1 pinned tags are not held by the runtime as their pinned digests: reg.example/team/a:v2 (pods naming them would need the registry)"

// kubeletRead is cond once imagepind has read the kubelet's configuration: until then,
// set's RegistryIndependent message says it is reading it, besides the rest.
func kubeletRead(set string, cond func(status.Node) bool) func(status.Node) bool {
	return func(n status.Node) bool {
		return cond(n) && !strings.Contains(n.Set(set).Condition(status.ConditionRegistryIndependent).Message, "reading the kubelet's")
	}
}

// A set whose pinned tag the runtime does not hold is not RegistryIndependent even
// Ready: a pod naming the tag would pull it. It becomes so once the tag is held.
func TestAgentSaysWhenAPinnedTagIsNotHeld(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	held := false
	digest := fmt.Sprintf("sha256:%064x", 1)
	h.tags = heldTags(func(t pinset.Tag) bool {
		mu.Lock()
		defer mu.Unlock()
		return held && t == pinset.Tag{Name: "reg.example/team/a:v2", Image: "reg.example/team/a@" + digest}
	})
	h.kubelet = func() (kubelet.Verification, error) {
		return kubelet.NewVerification(kubelet.Config{FeatureGates: map[string]bool{kubelet.FeatureGate: true}}, kubelet.PullRecords{Enabled: true}, kubelet.Version{})
	}
	a, b := "reg.example/team/a@"+digest, img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("apps.yaml", setDoc("apps", "reg.example/team/a:v2@"+digest, b))
	cond := func(want, reason string) func(status.Node) bool {
		return func(n status.Node) bool {
			s := n.Set("apps")
			if s == nil || s.Phase != status.Ready {
				return false
			}
			c := s.Condition(status.ConditionRegistryIndependent)
			return c != nil && c.Status == want && c.Reason == reason
		}
	}
	n := h.waitFor("Ready, its tag not held, the kubelet read", kubeletRead("apps", cond(status.False, status.ReasonTagsNotHeld)))
	if c := n.Set("apps").Condition(status.ConditionRegistryIndependent); c.Message != tagNotHeld {
		t.Fatalf("message %q; want %q", c.Message, tagNotHeld)
	}
	mu.Lock()
	held = true
	mu.Unlock()
	h.trigger()
	n = h.waitFor("RegistryIndependent once the tag is held", cond(status.True, status.ReasonPodsStartWithoutRegistry))
	if c := n.Set("apps").Condition(status.ConditionRegistryIndependent); !strings.Contains(c.Message, "2 images present and pinned, 1 pinned tags held as their pinned digests; ") {
		t.Fatalf("message %q", c.Message)
	}
}

// The agent reads the kubelet at start and again every VerifyEvery: a set Ready under
// AlwaysVerify is not RegistryIndependent, and becomes so when the policy changes.
func TestAgentSaysWhenPodStartsNeedTheRegistry(t *testing.T) {
	h := newHarness(t)
	h.cfg.VerifyEvery = 100 * time.Millisecond
	var mu sync.Mutex
	policy := kubelet.AlwaysVerify
	h.kubelet = func() (kubelet.Verification, error) {
		mu.Lock()
		defer mu.Unlock()
		return kubelet.NewVerification(kubelet.Config{ImagePullCredentialsVerificationPolicy: policy,
			FeatureGates: map[string]bool{kubelet.FeatureGate: true}}, kubelet.PullRecords{Enabled: true}, kubelet.Version{})
	}
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("upgrade.yaml", setDoc("upgrade", a, b))
	cond := func(want, reason string) func(status.Node) bool {
		return func(n status.Node) bool {
			s := n.Set("upgrade")
			if s == nil || s.Phase != status.Ready {
				return false
			}
			c := s.Condition(status.ConditionRegistryIndependent)
			return c != nil && c.Status == want && c.Reason == reason
		}
	}
	n := h.waitFor("Ready, needing the registry", cond(status.False, status.ReasonCredentialVerification))
	if c := n.Set("upgrade").Condition(status.ConditionRegistryIndependent); !strings.Contains(c.Message, "AlwaysVerify: 2 of 2 images") {
		t.Fatalf("message %q", c.Message)
	}
	mu.Lock()
	policy = kubelet.NeverVerify
	mu.Unlock()
	h.waitFor("RegistryIndependent after the policy changed", cond(status.True, status.ReasonPodsStartWithoutRegistry))
}

// fakeBlobs is the node's store as the agent asks it: which blobs of each image it
// holds (held, by digest).
type fakeBlobs struct {
	mu   sync.Mutex
	held map[string]bool
}

func (f *fakeBlobs) ImageBlobs(image string) ([]status.Blob, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.Contains(image, "/b@") {
		return nil, "its manifest is not in the store yet"
	}
	// Given out of order and one twice: the agent sorts them, each once.
	var out []status.Blob
	for _, d := range []string{"sha256:" + strings.Repeat("3", 64), "sha256:" + strings.Repeat("1", 64), "sha256:" + strings.Repeat("3", 64)} {
		out = append(out, status.Blob{Digest: d, Size: 7, Held: f.held[d]})
	}
	return out, ""
}

// fakeHolders is the aggregator's count, as the reporter keeps it.
type fakeHolders struct {
	mu    sync.Mutex
	count status.BlobHolders
}

func (f *fakeHolders) Holders(string) status.BlobHolders {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count
}

func (f *fakeHolders) set(h status.BlobHolders) {
	f.mu.Lock()
	f.count = h
	f.mu.Unlock()
}

// The node's status carries each pinned image's blobs, which the store holds, and the
// sets that pin it, for the aggregator to count; the set is RegistryIndependent only
// when the aggregator counts two holders of every blob: False naming the blobs held by
// fewer, Unknown without a count.
func TestAgentReportsItsBlobsAndTakesTheCountOfHolders(t *testing.T) {
	h := newHarness(t)
	h.kubelet = func() (kubelet.Verification, error) {
		return kubelet.NewVerification(kubelet.Config{FeatureGates: map[string]bool{kubelet.FeatureGate: true}}, kubelet.PullRecords{Enabled: true}, kubelet.Version{})
	}
	store := &fakeBlobs{held: map[string]bool{"sha256:" + strings.Repeat("1", 64): true}}
	holders := &fakeHolders{count: status.HoldersUnknown("no answer from the aggregator yet")}
	h.blobs, h.holders = store, holders
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("apps.yaml", setDoc("apps", a, b))
	h.writeFile("more.yaml", setDoc("more", a))
	registry := func(want, reason string) func(status.Node) bool {
		return func(n status.Node) bool {
			s := n.Set("apps")
			if s == nil || s.Phase != status.Ready {
				return false
			}
			c := s.Condition(status.ConditionRegistryIndependent)
			return c != nil && c.Status == want && c.Reason == reason
		}
	}
	// Both sets loaded (the two files are read as they come): image a's blobs name both.
	both := func(n status.Node) bool {
		return kubeletRead("apps", registry(status.Unknown, status.ReasonBlobHoldersUnknown))(n) && n.Set("more") != nil
	}
	n := h.waitFor("Ready with both sets, the holders not counted, the kubelet read", both)
	if c := n.Set("apps").Condition(status.ConditionRegistryIndependent); c.Message != "whether every blob of the images is held by 2 nodes cannot be told: no answer from the aggregator yet; this node's own pods start from its 2 images with the registry gone (imagePullCredentialsVerificationPolicy NeverVerifyPreloadedImages: pods start from these 2 images without the registry)" {
		t.Fatalf("message %q", c.Message)
	}
	want := []status.ImageBlobs{
		{Image: a, Sets: []string{"apps", "more"}, Blobs: []status.Blob{{Digest: "sha256:" + strings.Repeat("1", 64), Size: 7, Held: true}, {Digest: "sha256:" + strings.Repeat("3", 64), Size: 7}}},
		{Image: b, Sets: []string{"apps"}, Unknown: "its manifest is not in the store yet"},
	}
	if fmt.Sprint(n.Blobs) != fmt.Sprint(want) {
		t.Fatalf("blobs %+v; want %+v", n.Blobs, want)
	}

	short := status.BlobHolders{Status: status.False, Images: 2, Blobs: 2, ShortCount: 1, Short: []status.ShortBlob{
		{Digest: "sha256:" + strings.Repeat("3", 64), Image: a, Size: 7, Pinners: 3}}}
	holders.set(short)
	h.trigger()
	n = h.waitFor("the blobs held by too few nodes", registry(status.False, status.ReasonBlobsNotHeld))
	if c := n.Set("apps").Condition(status.ConditionRegistryIndependent); !strings.HasPrefix(c.Message, short.Why()+"; this node's own pods start") ||
		!strings.Contains(c.Message, "sha256:"+strings.Repeat("3", 64)+" (7 B, of "+a+") is held by no node: any node joining, or replacing one of the 3 that pin the image, would fail") {
		t.Fatalf("message %q", c.Message)
	}
	// The node's own pods start: its node-local condition says so apart.
	if c := n.Set("apps").Condition(status.ConditionPodsStartWithoutRegistry); c == nil || c.Status != status.True || c.Reason != status.ReasonImagesHeld ||
		strings.Contains(c.Message, "held by no node") {
		t.Fatalf("PodsStartWithoutRegistry with blobs held by too few nodes: %+v", c)
	}

	holders.set(status.BlobHolders{Status: status.True, Images: 2, Blobs: 2})
	store.mu.Lock()
	store.held["sha256:"+strings.Repeat("3", 64)] = true
	store.mu.Unlock()
	h.trigger()
	n = h.waitFor("every blob held twice", registry(status.True, status.ReasonPodsStartWithoutRegistry))
	if !n.Blobs[0].Blobs[1].Held {
		t.Fatalf("the store's new blob not reported: %+v", n.Blobs)
	}

	h.stop()
	h.holders, h.noAggregator = nil, true
	h.start() // without an aggregator: never True
	n = h.waitFor("no aggregator", registry(status.Unknown, status.ReasonBlobHoldersUnknown))
	own := "; this node's own pods start from its 2 images with the registry gone (imagePullCredentialsVerificationPolicy NeverVerifyPreloadedImages: pods start from these 2 images without the registry)"
	if c := n.Set("apps").Condition(status.ConditionRegistryIndependent); !strings.HasSuffix(c.Message, "no aggregator counts them ([report] aggregator is not set)"+own) {
		t.Fatalf("message %q", c.Message)
	}

	h.stop()
	h.blobs = nil
	h.start() // [peers] off too: joining nodes need the registry
	n = h.waitFor("[peers] off, no aggregator", func(n status.Node) bool {
		c := n.Set("apps").Condition(status.ConditionRegistryIndependent)
		return registry(status.Unknown, status.ReasonBlobHoldersUnknown)(n) && strings.Contains(c.Message, "[peers] is off")
	})
	if c := n.Set("apps").Condition(status.ConditionRegistryIndependent); !strings.HasSuffix(c.Message,
		"no aggregator counts them ([report] aggregator is not set), and this node shares none ([peers] is off): a node joining, or replacing this one, would need the registry"+own) {
		t.Fatalf("message %q", c.Message)
	}
}

// heldTags is a Deps.Tags whose Held is the func; it wants nothing and reports nothing.
type heldTags func(pinset.Tag) bool

func (heldTags) Want([]pinset.Tag)                {}
func (heldTags) Arrived(string)                   {}
func (h heldTags) Held(t pinset.Tag) bool         { return h(t) }
func (heldTags) Status() (*status.Tags, []string) { return nil, nil }

// arrivalTags is a Deps.Tags that records the images the agent says arrived.
type arrivalTags struct {
	heldTags
	mu      sync.Mutex
	arrived []string
}

func (a *arrivalTags) Arrived(image string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.arrived = append(a.arrived, image)
}

func (a *arrivalTags) got() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.arrived)
}

// The tags are told each pinned image the moment its pull ends: a tag waiting for its
// digest is then made at once, not at the keeper's next retry (the joining node's
// PinnedImagesReady, and with it the startup taint, waits for its tags).
func TestTheTagsAreToldWhenAnImageArrives(t *testing.T) {
	h := newHarness(t)
	tags := &arrivalTags{heldTags: func(pinset.Tag) bool { return false }}
	h.tags = tags
	a := "reg.example/team/a@" + fmt.Sprintf("sha256:%064x", 1)
	h.available(a)
	h.start()
	h.writeFile("apps.yaml", setDoc("apps", "reg.example/team/a:v2@"+fmt.Sprintf("sha256:%064x", 1)))
	h.waitFor("apps Ready", func(n status.Node) bool { s := n.Set("apps"); return s != nil && s.Phase == status.Ready })
	if got := tags.got(); !slices.Contains(got, a) {
		t.Fatalf("the tags were told %v arrived; want %s", got, a)
	}
}
