package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

const header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"

// Drop-ins merge as the kubelet merges them: a JSON merge patch per .conf file in
// lexical order, lists replaced, maps merged key by key, null removes.
func TestLoadConfigMergesDropInsAsTheKubelet(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "kubelet.conf")
	write(t, main, header+`imageGCHighThresholdPercent: 80
featureGates: {KubeletEnsureSecretPulledImages: true, Other: true}
imagePullCredentialsVerificationPolicy: AlwaysVerify
preloadedImagesVerificationAllowlist: ["a.example/*"]
`)
	d := filepath.Join(dir, "kubelet.conf.d")
	write(t, filepath.Join(d, "10-policy.conf"), header+`imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages
preloadedImagesVerificationAllowlist: ["b.example/*"]
featureGates: {Other: null}
`)
	write(t, filepath.Join(d, "20-gc.conf"), header+"imageGCHighThresholdPercent: 90\n")
	write(t, filepath.Join(d, "30-ignored.yaml"), header+"imageGCHighThresholdPercent: 10\n")
	write(t, filepath.Join(d, "sub", "40-nested.conf"), header+`preloadedImagesVerificationAllowlist: ["c.example/*"]`+"\n")
	c, err := LoadConfig(main, d)
	if err != nil {
		t.Fatal(err)
	}
	if c.ImageGCHighThresholdPercent == nil || *c.ImageGCHighThresholdPercent != 90 {
		t.Fatalf("imageGCHighThresholdPercent %v, want 90 from 20-gc.conf", c.ImageGCHighThresholdPercent)
	}
	if c.ImagePullCredentialsVerificationPolicy != NeverVerifyAllowlistedImages {
		t.Fatalf("policy %q", c.ImagePullCredentialsVerificationPolicy)
	}
	if !reflect.DeepEqual(c.PreloadedImagesVerificationAllowlist, []string{"c.example/*"}) {
		t.Fatalf("allowlist %v: a later drop-in replaces the list", c.PreloadedImagesVerificationAllowlist)
	}
	if !reflect.DeepEqual(c.FeatureGates, map[string]bool{FeatureGate: true}) {
		t.Fatalf("feature gates %v: merged by key, null removes", c.FeatureGates)
	}
	if len(c.Files) != 4 || c.Files[0] != main {
		t.Fatalf("files read %v", c.Files)
	}
}

// The kubelet merges drop-ins in filepath.WalkDir's order, not in sorted-path order: a
// subdirectory 10/ is walked before 10-z.conf (the name "10" sorts first) although the
// path ".../10-z.conf" sorts before ".../10/a.conf". Both the policy and the image GC
// threshold come out as the kubelet has them.
func TestLoadConfigMergesInTheKubeletsWalkOrder(t *testing.T) {
	dir := t.TempDir()
	d := filepath.Join(dir, "kubelet.conf.d")
	write(t, filepath.Join(d, "10", "a.conf"), header+"imagePullCredentialsVerificationPolicy: NeverVerify\nimageGCHighThresholdPercent: 95\n")
	write(t, filepath.Join(d, "10-z.conf"), header+"imagePullCredentialsVerificationPolicy: AlwaysVerify\nimageGCHighThresholdPercent: 70\n")
	c, err := LoadConfig("", d)
	if err != nil {
		t.Fatal(err)
	}
	if c.ImagePullCredentialsVerificationPolicy != AlwaysVerify {
		t.Errorf("policy %q, want AlwaysVerify (10-z.conf is merged last)", c.ImagePullCredentialsVerificationPolicy)
	}
	if got := c.ImageGCHighThresholdPercent; got == nil || *got != 70 {
		t.Errorf("imageGCHighThresholdPercent %v, want 70 (10-z.conf is merged last)", fmt.Sprint(deref(got)))
	}
	want := []string{filepath.Join(d, "10", "a.conf"), filepath.Join(d, "10-z.conf")}
	if !reflect.DeepEqual(c.Files, want) {
		t.Errorf("files merged %v, want %v", c.Files, want)
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestLoadConfigErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	if c, err := LoadConfig(filepath.Join(dir, "none"), filepath.Join(dir, "none.d")); err != nil || len(c.Files) != 0 {
		t.Fatalf("missing config and dir: %+v, %v (a kubelet without them)", c, err)
	}
	bad := filepath.Join(dir, "d", "10-bad.conf")
	write(t, bad, "imageGCHighThresholdPercent: 90\n")
	if _, err := LoadConfig("", filepath.Join(dir, "d")); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "apiVersion") {
		t.Fatalf("drop-in without apiVersion/kind: %v", err)
	}
	other := filepath.Join(dir, "o", "10-other.conf")
	write(t, other, "apiVersion: v1\nkind: ConfigMap\n")
	if _, err := LoadConfig("", filepath.Join(dir, "o")); err == nil || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), "KubeletConfiguration") {
		t.Fatalf("drop-in of another kind: %v", err)
	}
	broken := filepath.Join(dir, "broken.yaml")
	write(t, broken, "imageGCHighThresholdPercent: [\n")
	if _, err := LoadConfig(broken, ""); err == nil || !strings.Contains(err.Error(), broken) {
		t.Fatalf("malformed config: %v", err)
	}
}

func records(t *testing.T) string {
	root := t.TempDir()
	// As the kubelet 1.35 writes them (pkg/kubelet/images/pullmanager/testdata).
	write(t, filepath.Join(root, "image_manager/pulled/sha256-1"), `{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2026-11-23T12:26:40Z","imageRef":"id-anon","credentialMapping":{"reg.example/team/anon":{"nodePodsAccessible":true}}}`)
	write(t, filepath.Join(root, "image_manager/pulled/sha256-2"), `{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2026-11-23T12:26:40Z","imageRef":"id-secret","credentialMapping":{"reg.example/team/private":{"kubernetesSecrets":[{"uid":"u","namespace":"default","name":"pull","credentialHash":"h"}]}}}`)
	write(t, filepath.Join(root, "image_manager/pulled/sha256-3"), `not json`)
	write(t, filepath.Join(root, "image_manager/pulling/sha256-4"), `{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1","image":"reg.example/team/interrupted:1"}`)
	return root
}

func TestReadPullRecords(t *testing.T) {
	r, err := ReadPullRecords(records(t))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Enabled || len(r.Pulled) != 2 || !r.Pulling["reg.example/team/interrupted:1"] {
		t.Fatalf("records %+v", r)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "sha256-3") {
		t.Fatalf("problems %v: the unreadable record is named", r.Problems)
	}
	none, err := ReadPullRecords(t.TempDir())
	if err != nil || none.Enabled {
		t.Fatalf("no image_manager: %+v, %v", none, err)
	}
}

func TestNeedsRegistry(t *testing.T) {
	recs, err := ReadPullRecords(records(t))
	if err != nil {
		t.Fatal(err)
	}
	const (
		pinned  = "reg.example/team/app@sha256:1111111111111111111111111111111111111111111111111111111111111111"
		other   = "other.example/ns/app@sha256:2222222222222222222222222222222222222222222222222222222222222222"
		anon    = "reg.example/team/anon@sha256:3333333333333333333333333333333333333333333333333333333333333333"
		private = "reg.example/team/private@sha256:4444444444444444444444444444444444444444444444444444444444444444"
	)
	ids := map[string]string{pinned: "id-pinned", other: "id-other", anon: "id-anon", private: "id-secret"}
	gateOn := map[string]bool{FeatureGate: true}
	cases := []struct {
		name  string
		cfg   Config
		recs  PullRecords
		image string
		need  bool
		why   string
	}{
		{"gate off: nothing verified", Config{ImagePullCredentialsVerificationPolicy: AlwaysVerify, FeatureGates: map[string]bool{FeatureGate: false}}, recs, pinned, false, ""},
		{"gate unset, no records dir: off", Config{ImagePullCredentialsVerificationPolicy: AlwaysVerify}, PullRecords{}, pinned, false, ""},
		{"gate unset, records dir: on", Config{ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, pinned, true, "AlwaysVerify"},
		{"default policy, pre-loaded", Config{FeatureGates: gateOn}, recs, pinned, false, ""},
		{"default policy, kubelet pulled it with a secret", Config{FeatureGates: gateOn}, recs, private, true, "pulled it itself"},
		{"default policy, kubelet pulled it anonymously", Config{FeatureGates: gateOn}, recs, anon, false, ""},
		{"default policy, an interrupted kubelet pull", Config{FeatureGates: gateOn}, recs, "reg.example/team/interrupted:1", true, "began a pull"},
		{"NeverVerify", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerify}, recs, private, false, ""},
		{"AlwaysVerify, pre-loaded", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, pinned, true, "AlwaysVerify"},
		{"AlwaysVerify, kubelet pulled it anonymously", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, anon, false, ""},
		{"AlwaysVerify, pulled with a secret: depends on the pod", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, private, true, "are let through"},
		{"allowlisted by prefix", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"reg.example/team/*"}}, recs, pinned, false, ""},
		{"not allowlisted", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"reg.example/team/*"}}, recs, other, true, "Allowlist"},
		// The kubelet compares an exact entry with the image string as written: a digest
		// reference never equals a name without one.
		{"exact entry does not match a digest reference", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"reg.example/team/app"}}, recs, pinned, true, "Allowlist"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := NewVerification(c.cfg, c.recs)
			if err != nil {
				t.Fatal(err)
			}
			need, why := v.NeedsRegistry(c.image, ids[c.image])
			if need != c.need || !strings.Contains(why, c.why) {
				t.Fatalf("NeedsRegistry = %v %q, want %v containing %q", need, why, c.need, c.why)
			}
		})
	}
}

// The allowlist is validated as the kubelet validates it (image_pull_policies_test.go).
func TestAllowlistValidation(t *testing.T) {
	for _, bad := range []string{" a.example/*", "*", "/*", "a.example/*/x", "a.example/app:1", "a.example/app@sha256:" + strings.Repeat("1", 64), "a.example/ap*"} {
		if _, err := NewVerification(Config{ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{bad}}, PullRecords{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := NewVerification(Config{ImagePullCredentialsVerificationPolicy: "Sometimes"}, PullRecords{}); err == nil || !strings.Contains(err.Error(), "Sometimes") {
		t.Errorf("unknown policy: %v", err)
	}
	if _, err := NewVerification(Config{ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"a.example/app", "a.example/*"}}, PullRecords{}); err != nil {
		t.Errorf("good allowlist refused: %v", err)
	}
}

// Needs finds each image's ID in the runtime's listing (names lower-cased, as
// ListImages gives them): a kubelet record for that ID makes it need the registry.
func TestNeedsLooksUpIDsInTheListing(t *testing.T) {
	recs, err := ReadPullRecords(records(t))
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerification(Config{FeatureGates: map[string]bool{FeatureGate: true}}, recs)
	if err != nil {
		t.Fatal(err)
	}
	private := "reg.example/team/private@sha256:" + strings.Repeat("4", 64)
	other := "reg.example/team/Other@sha256:" + strings.Repeat("5", 64)
	listed := map[string]string{strings.ToLower(private): "id-secret", strings.ToLower(other): "id-other"}
	needs := v.Needs([]string{other, private}, listed)
	if len(needs) != 1 || needs[0].Image != private || !strings.Contains(needs[0].Why, "pulled it itself") {
		t.Fatalf("needs %+v", needs)
	}
	if needs := v.Needs([]string{private}, nil); len(needs) != 0 {
		t.Fatalf("an image the runtime does not list matched a record: %+v", needs)
	}
}
