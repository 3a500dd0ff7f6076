package registrygone

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
)

const (
	a = "reg.example/team/a@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	b = "reg.example/team/b@sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

var tagA = pinset.Tag{Name: "reg.example/team/a:v2", Image: a}

func verification(t *testing.T, policy string, gate bool) kubelet.Verification {
	t.Helper()
	c := kubelet.Config{ImagePullCredentialsVerificationPolicy: policy}
	records := kubelet.PullRecords{}
	if gate {
		c.FeatureGates = map[string]bool{kubelet.FeatureGate: true}
		records.Enabled = true
	}
	v, err := kubelet.NewVerification(c, records, kubelet.Version{})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The aggregator's count: every blob of the images held by two nodes.
var held = status.BlobHolders{Status: status.True, Images: 2, Blobs: 7}

// Two blobs held by fewer than two nodes: one by none, one by node-a alone.
var (
	short = status.BlobHolders{Status: status.False, Images: 2, Blobs: 7, ShortCount: 2, Short: []status.ShortBlob{
		{Digest: "sha256:" + strings.Repeat("e", 64), Image: a, Size: 3 << 20, Pinners: 3},
		{Digest: "sha256:" + strings.Repeat("f", 64), Image: b, Size: 2048, Holders: []string{"node-a"}, Pinners: 3},
	}}
	shortWhy = "2 of the 7 blobs of the images are held by fewer than 2 nodes (with the registry gone, a node joining or replacing one gets every blob from its peers): " +
		"sha256:" + strings.Repeat("e", 64) + " (3.0 MiB, of " + a + ") is held by no node: any node joining, or replacing one of the 3 that pin the image, would fail; " +
		"sha256:" + strings.Repeat("f", 64) + " (2.0 KiB, of " + b + ") is held by node-a only: a node replacing node-a would fail, and any node joining once node-a is gone"
)

// Every reason, and which fact wins: a sure False (images, then tags, then the kubelet,
// then the blobs' holders) before an Unknown (the runtime, then the kubelet not read,
// unreadable, undecided, then the holders not counted). Every obstacle is listed
// whatever wins.
func TestDecide(t *testing.T) {
	preloaded := verification(t, kubelet.NeverVerifyPreloadedImages, true)
	always := verification(t, kubelet.AlwaysVerify, true)
	alwaysGateUnknown := verification(t, kubelet.AlwaysVerify, false)
	ready := func(mod func(*Facts)) Facts {
		f := Facts{Images: []string{a, b}, KubeletRead: true, Verification: preloaded, IDs: map[string]string{a: "id-a", b: "id-b"}, Holders: held}
		if mod != nil {
			mod(&f)
		}
		return f
	}
	down := errors.New("connection refused")
	noAnswer := status.HoldersUnknown("no answer from the aggregator for 1m30s")
	notHeld := "1 of 1 pinned tags are not held by the runtime as their pinned digests: reg.example/team/a:v2 (pods naming them would need the registry)"
	for _, c := range []struct {
		name           string
		f              Facts
		status, reason string
		why            []string // each in Why, in this order
		msg            string   // in Message
	}{
		{name: "every image present and pinned, default policy", f: ready(nil), status: status.True, reason: status.ReasonPodsStartWithoutRegistry,
			msg: "2 images present and pinned; imagePullCredentialsVerificationPolicy NeverVerifyPreloadedImages: pods start from these 2 images"},
		{name: "every blob held by 2 nodes", f: ready(nil), status: status.True, reason: status.ReasonPodsStartWithoutRegistry,
			msg: "; each of the 7 blobs of the images held by at least 2 nodes"},
		{name: "tags held", f: ready(func(f *Facts) { f.Tags, f.Held = []pinset.Tag{tagA}, map[string]bool{tagA.Name: true} }),
			status: status.True, reason: status.ReasonPodsStartWithoutRegistry, msg: "2 images present and pinned, 1 pinned tags held as their pinned digests; "},
		{name: "an image missing", f: ready(func(f *Facts) { f.Missing = []string{b} }), status: status.False, reason: status.ReasonNotReady,
			why: []string{"1 of 2 images are not on the node: " + b}},
		{name: "an image not pinned", f: ready(func(f *Facts) { f.Unpinned = []string{a} }), status: status.False, reason: status.ReasonNotReady,
			why: []string{"1 of 2 images are present but not pinned (the kubelet's image garbage collector may remove them): " + a}},
		{name: "not Ready for another reason", f: ready(func(f *Facts) { f.NotReady = "pins written; waiting for CRI-O to have them in effect" }),
			status: status.False, reason: status.ReasonNotReady, why: []string{"not every image is present and pinned: pins written; waiting for CRI-O"}},
		{name: "a sure obstacle with the runtime down", f: ready(func(f *Facts) {
			f.RuntimeErr, f.Missing, f.NotReady = down, []string{a, b}, "release quay.io/r@sha256:1 cannot be expanded"
		}), status: status.False, reason: status.ReasonNotReady, why: []string{"the container runtime does not answer", "not every image is present and pinned: release quay.io/r@sha256:1 cannot be expanded"}},
		{name: "the phase's words give way to the images'", f: ready(func(f *Facts) { f.Missing, f.NotReady = []string{b}, "1/2 images ready" }),
			status: status.False, reason: status.ReasonNotReady, why: []string{"1 of 2 images are not on the node"}},
		{name: "a tag not held", f: ready(func(f *Facts) { f.Tags = []pinset.Tag{tagA} }), status: status.False, reason: status.ReasonTagsNotHeld, why: []string{notHeld}},
		{name: "AlwaysVerify", f: ready(func(f *Facts) { f.Verification = always }), status: status.False, reason: status.ReasonCredentialVerification,
			why: []string{"AlwaysVerify: 2 of 2 images need the registry"}},
		{name: "the runtime does not answer", f: ready(func(f *Facts) { f.RuntimeErr, f.IDs = down, nil }), status: status.Unknown, reason: status.ReasonRuntimeUnavailable,
			why: []string{"the container runtime does not answer (connection refused)"}},
		{name: "the kubelet not read yet", f: ready(func(f *Facts) { f.KubeletRead = false }), status: status.Unknown, reason: status.ReasonCheckingKubelet,
			why: []string{"reading the kubelet's image pull credential verification"}},
		{name: "the kubelet's files unreadable", f: ready(func(f *Facts) { f.KubeletErr = errors.New("kubelet drop-in /x.conf: no apiVersion/kind") }),
			status: status.Unknown, reason: status.ReasonKubeletConfigUnreadable, why: []string{"cannot tell whether the kubelet verifies pull credentials at pod start: kubelet drop-in /x.conf"}},
		{name: "the kubelet's gate not known under AlwaysVerify", f: ready(func(f *Facts) { f.Verification = alwaysGateUnknown }),
			status: status.Unknown, reason: status.ReasonCredentialVerification, why: []string{"it cannot be told whether pods start from them without the registry"}},

		{name: "images before the kubelet", f: ready(func(f *Facts) { f.Missing, f.Verification = []string{b}, always }),
			status: status.False, reason: status.ReasonNotReady, why: []string{"1 of 2 images are not on the node", "AlwaysVerify: 2 of 2 images"}},
		{name: "tags before the kubelet", f: ready(func(f *Facts) { f.Tags, f.Verification = []pinset.Tag{tagA}, always }),
			status: status.False, reason: status.ReasonTagsNotHeld, why: []string{notHeld, "AlwaysVerify: 2 of 2 images"}},
		{name: "a sure False before the runtime not answering", f: ready(func(f *Facts) { f.RuntimeErr, f.Verification = down, always }),
			status: status.False, reason: status.ReasonCredentialVerification, why: []string{"does not answer", "AlwaysVerify: 2 of 2 images"}},
		{name: "a release that cannot be expanded, the runtime not answering", f: ready(func(f *Facts) { f.RuntimeErr, f.NotReady = down, "release r cannot be expanded" }),
			status: status.False, reason: status.ReasonNotReady, why: []string{"does not answer", "not every image is present and pinned: release r cannot be expanded"}},
		{name: "a blob held by no node, one by one node", f: ready(func(f *Facts) { f.Holders = short }), status: status.False, reason: status.ReasonBlobsNotHeld,
			why: []string{shortWhy}},
		{name: "no count of the holders", f: ready(func(f *Facts) { f.Holders = noAnswer }), status: status.Unknown, reason: status.ReasonBlobHoldersUnknown,
			why: []string{"whether every blob of the images is held by 2 nodes cannot be told: no answer from the aggregator for 1m30s"}},
		{name: "no count of the holders given at all", f: ready(func(f *Facts) { f.Holders = status.BlobHolders{} }), status: status.Unknown, reason: status.ReasonBlobHoldersUnknown,
			why: []string{"whether every blob of the images is held by 2 nodes cannot be told"}},
		{name: "the kubelet before the blobs", f: ready(func(f *Facts) { f.Holders, f.Verification = short, always }),
			status: status.False, reason: status.ReasonCredentialVerification, why: []string{"AlwaysVerify: 2 of 2 images", shortWhy}},
		{name: "blobs not held, a sure False before the runtime not answering", f: ready(func(f *Facts) { f.RuntimeErr, f.Holders = down, short }),
			status: status.False, reason: status.ReasonBlobsNotHeld, why: []string{"does not answer", shortWhy}},
		{name: "the kubelet's unknowns before the holders'", f: ready(func(f *Facts) { f.KubeletRead, f.Holders = false, noAnswer }),
			status: status.Unknown, reason: status.ReasonCheckingKubelet, why: []string{"reading the kubelet's", "cannot be told: no answer from the aggregator"}},
		{name: "the runtime first among the unknowns; its tags not told", f: ready(func(f *Facts) { f.RuntimeErr, f.KubeletRead, f.Tags = down, false, []pinset.Tag{tagA} }),
			status: status.Unknown, reason: status.ReasonRuntimeUnavailable, why: []string{"does not answer", "reading the kubelet's"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Decide(c.f)
			if v.Status != c.status || v.Reason != c.reason || !strings.Contains(v.Message, c.msg) {
				t.Fatalf("got %s/%s %q; want %s/%s containing %q", v.Status, v.Reason, v.Message, c.status, c.reason, c.msg)
			}
			if v.Ready() != (c.status == status.True) || (v.Ready() && len(v.Why) > 0) {
				t.Fatalf("ready %v with why %q", v.Ready(), v.Why)
			}
			if len(v.Why) != len(c.why) {
				t.Fatalf("why %q; want %d entries like %q", v.Why, len(c.why), c.why)
			}
			for i, w := range c.why {
				if !strings.Contains(v.Why[i], w) {
					t.Fatalf("why[%d] %q; want it to contain %q", i, v.Why[i], w)
				}
			}
			want := strings.Join(v.Why, "; ")
			if onlyHolders := len(v.Why) == 1 && (v.Reason == status.ReasonBlobsNotHeld || v.Reason == status.ReasonBlobHoldersUnknown); onlyHolders {
				// The node's own pods start: said after the cluster's count.
				want += "; this node's own pods start from its 2 images with the registry gone (imagePullCredentialsVerificationPolicy NeverVerifyPreloadedImages: pods start from these 2 images without the registry)"
			}
			if !v.Ready() && v.Message != want {
				t.Fatalf("message %q; want %q", v.Message, want)
			}
			cond := v.Condition()
			if cond.Type != status.ConditionRegistryIndependent || cond.Status != v.Status || cond.Reason != v.Reason || cond.Message != v.Message {
				t.Fatalf("condition %+v of %+v", cond, v)
			}
		})
	}
}

// The kubelet's own answer comes with the verdict, its images in need and unsure.
func TestDecideCarriesTheKubeletsAnswer(t *testing.T) {
	v := Decide(Facts{Images: []string{a, b}, KubeletRead: true, Verification: verification(t, kubelet.AlwaysVerify, true), Holders: held})
	if !v.KubeletDecided || v.Kubelet.Answer != kubelet.NeedsRegistry || len(v.Kubelet.Needs) != 2 || v.Policy != kubelet.AlwaysVerify {
		t.Fatalf("%+v", v)
	}
	if v := Decide(Facts{Images: []string{a}}); v.KubeletDecided || v.Policy != "" {
		t.Fatalf("not read, yet decided: %+v", v)
	}
}

// A tag is held when the runtime lists it with the image ID of its pinned digest.
func TestHeldTags(t *testing.T) {
	tagB := pinset.Tag{Name: "reg.example/team/b:v1", Image: b}
	moved := pinset.Tag{Name: "reg.example/team/a:latest", Image: a}
	// Tags keep their case: the runtime holds :v1 only, and a pod naming :V1 pulls.
	upper := pinset.Tag{Name: "reg.example/team/b:V1", Image: b}
	listed := map[string]string{
		a: "id-a", tagA.Name: "id-a",
		b:                       "id-b",
		moved.Name:              "id-other", // the registry's image under the tag
		"reg.example/team/b:v1": "id-b",
	}
	got := HeldTags([]pinset.Tag{tagA, tagB, moved, upper, {Name: "reg.example/team/c:v1", Image: "reg.example/team/c@sha256:" + strings.Repeat("3", 64)}}, listed)
	want := map[string]bool{tagA.Name: true, tagB.Name: true, moved.Name: false, upper.Name: false, "reg.example/team/c:v1": false}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("held %v; want %v", got, want)
	}
}

// A line names five images and counts the rest.
func TestDecideNamesFive(t *testing.T) {
	var images []string
	for i := range 7 {
		images = append(images, fmt.Sprintf("reg.example/team/i%d@sha256:%064x", i, i))
	}
	v := Decide(Facts{Images: images, Missing: images, KubeletRead: true, Verification: verification(t, "", true), Holders: held})
	if !strings.Contains(v.Why[0], "7 of 7 images are not on the node: ") || !strings.HasSuffix(v.Why[0], images[4]+" and 2 more") {
		t.Fatalf("%q", v.Why[0])
	}
}

// OwnPodsStart is the verdict for this node's own pods: the cluster's count of holders
// (short, or not counted yet, as on a node that just joined) left out, every other
// obstacle kept, sure or not.
func TestOwnPodsStartLeavesTheCountOut(t *testing.T) {
	preloaded := verification(t, kubelet.NeverVerifyPreloadedImages, true)
	gateUnknown := verification(t, kubelet.AlwaysVerify, false)
	for _, tc := range []struct {
		name string
		mod  func(*Facts)
		want bool
	}{
		{"every blob held twice", func(*Facts) {}, true},
		{"blobs held by too few nodes", func(f *Facts) { f.Holders = short }, true},
		{"the holders not counted yet", func(f *Facts) { f.Holders = status.HoldersUnknown("no answer from the aggregator yet") }, true},
		{"an image missing", func(f *Facts) { f.Holders, f.Missing = short, []string{b} }, false},
		{"a tag not held", func(f *Facts) { f.Holders, f.Tags = short, []pinset.Tag{tagA} }, false},
		{"the kubelet's verification undecided", func(f *Facts) { f.Holders, f.Verification = short, gateUnknown }, false},
		{"the kubelet not read", func(f *Facts) { f.Holders, f.KubeletRead = short, false }, false},
		{"the runtime down", func(f *Facts) { f.Holders, f.RuntimeErr = short, errors.New("down") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Facts{Images: []string{a, b}, KubeletRead: true, Verification: preloaded, IDs: map[string]string{a: "id-a", b: "id-b"}, Holders: held}
			tc.mod(&f)
			if v := Decide(f); v.OwnPodsStart() != tc.want {
				t.Fatalf("OwnPodsStart %v (verdict %s/%s: %s); want %v", v.OwnPodsStart(), v.Status, v.Reason, v.Message, tc.want)
			}
		})
	}
}

// The node-local part says whether this node's own pods start, apart from the cluster's
// count of holders: True (ImagesHeld) when only the count stands in the way, and the
// kubelet's unsure answer stays Unknown there though blobs held by too few nodes make
// the whole a sure False (BlobsNotHeld).
func TestDecideNodePart(t *testing.T) {
	preloaded := verification(t, kubelet.NeverVerifyPreloadedImages, true)
	alwaysGateUnknown := verification(t, kubelet.AlwaysVerify, false)
	ready := func(mod func(*Facts)) Facts {
		f := Facts{Images: []string{a, b}, KubeletRead: true, Verification: preloaded, IDs: map[string]string{a: "id-a", b: "id-b"}, Holders: held}
		if mod != nil {
			mod(&f)
		}
		return f
	}
	for _, c := range []struct {
		name               string
		f                  Facts
		whole, wholeReason string
		node, nodeReason   string
		nodeWhy            int
	}{
		{"everything held", ready(nil), status.True, status.ReasonPodsStartWithoutRegistry, status.True, status.ReasonImagesHeld, 0},
		{"blobs short only", ready(func(f *Facts) { f.Holders = short }), status.False, status.ReasonBlobsNotHeld, status.True, status.ReasonImagesHeld, 0},
		{"no count of holders", ready(func(f *Facts) { f.Holders = status.HoldersUnknown("no answer") }), status.Unknown, status.ReasonBlobHoldersUnknown, status.True, status.ReasonImagesHeld, 0},
		{"the kubelet unsure, blobs short", ready(func(f *Facts) { f.Holders, f.Verification = short, alwaysGateUnknown }),
			status.False, status.ReasonBlobsNotHeld, status.Unknown, status.ReasonCredentialVerification, 1},
		{"the kubelet not read, blobs short", ready(func(f *Facts) { f.Holders, f.KubeletRead = short, false }),
			status.False, status.ReasonBlobsNotHeld, status.Unknown, status.ReasonCheckingKubelet, 1},
		{"an image missing, blobs short", ready(func(f *Facts) { f.Holders, f.Missing = short, []string{b} }),
			status.False, status.ReasonNotReady, status.False, status.ReasonNotReady, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Decide(c.f)
			if v.Status != c.whole || v.Reason != c.wholeReason {
				t.Fatalf("whole %s/%s; want %s/%s", v.Status, v.Reason, c.whole, c.wholeReason)
			}
			nc := v.NodeCondition()
			if nc.Type != status.ConditionPodsStartWithoutRegistry || nc.Status != c.node || nc.Reason != c.nodeReason || len(v.Node.Why) != c.nodeWhy {
				t.Fatalf("node part %+v (why %q); want %s/%s with %d obstacles", nc, v.Node.Why, c.node, c.nodeReason, c.nodeWhy)
			}
			for _, w := range v.Node.Why {
				if strings.Contains(w, "held by fewer than") || strings.Contains(w, "cannot be told: no answer") {
					t.Fatalf("the node part names the cluster's count: %q", w)
				}
			}
			if c.node == status.True && nc.Message != "2 images present and pinned; imagePullCredentialsVerificationPolicy NeverVerifyPreloadedImages: pods start from these 2 images without the registry" {
				t.Fatalf("node part's message %q", nc.Message)
			}
			if c.node != status.True && nc.Message != strings.Join(v.Node.Why, "; ") {
				t.Fatalf("node part's message %q; want its obstacles joined", nc.Message)
			}
		})
	}
}
