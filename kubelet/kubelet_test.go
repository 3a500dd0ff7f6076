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

const (
	pulledKind  = `"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2026-11-23T12:26:40Z"`
	pullingKind = `"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1"`
)

// pulled writes a record of the kubelet's pull of imageRef where the kubelet keeps it.
func pulled(t *testing.T, root, imageRef, rest string) string {
	path := filepath.Join(root, "image_manager/pulled", recordFile(imageRef))
	write(t, path, `{`+pulledKind+`,"imageRef":"`+imageRef+`"`+rest+`}`)
	return path
}

func records(t *testing.T) string {
	root := t.TempDir()
	// As the kubelet 1.34 wrote them (v1alpha1) and 1.35 writes them (v1beta1), both of
	// which 1.35 reads.
	write(t, filepath.Join(root, "image_manager/pulled", recordFile("id-beta")), `{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2026-11-28T03:59:12Z","imageRef":"id-beta","credentialMapping":{"reg.example/team/beta":{"nodePodsAccessible":true}}}`)
	pulled(t, root, "id-anon", `,"credentialMapping":{"reg.example/team/anon":{"nodePodsAccessible":true}}`)
	pulled(t, root, "id-secret", `,"credentialMapping":{"reg.example/team/private":{"kubernetesSecrets":[{"uid":"u","namespace":"default","name":"pull","credentialHash":"h"}]}}`)
	write(t, filepath.Join(root, "image_manager/pulled", recordFile("id-broken")), `not json`)
	write(t, filepath.Join(root, "image_manager/pulling", recordFile("reg.example/team/interrupted:1")), `{`+pullingKind+`,"image":"reg.example/team/interrupted:1"}`)
	return root
}

func TestReadPullRecords(t *testing.T) {
	root := records(t)
	dir := filepath.Join(root, "image_manager/pulled")
	// Neither is looked at by the kubelet: a record at another name than its imageRef's,
	// a .tmp file of a write in progress.
	write(t, filepath.Join(dir, "sha256-elsewhere"), `{`+pulledKind+`,"imageRef":"id-elsewhere"}`)
	write(t, filepath.Join(dir, recordFile("id-tmp")+".tmp"), `not json`)
	// What the kubelet's strict decoder refuses is refused here too.
	for id, body := range map[string]string{
		"id-unknown-field": `{` + pulledKind + `,"imageRef":"id-unknown-field","extra":1}`,
		"id-other-kind":    `{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1","imageRef":"id-other-kind"}`,
		"id-no-version":    `{"kind":"ImagePulledRecord","imageRef":"id-no-version"}`,
		"id-v1":            `{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1","imageRef":"id-v1"}`,
	} {
		write(t, filepath.Join(dir, recordFile(id)), body)
	}
	if err := os.MkdirAll(filepath.Join(dir, recordFile("id-dir")), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := ReadPullRecords(root)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Enabled || len(r.Pulled) != 3 || !r.Pulled["id-beta"].CredentialMapping["reg.example/team/beta"].NodePodsAccessible || !r.Pulling["reg.example/team/interrupted:1"] {
		t.Fatalf("records %+v", r)
	}
	for _, id := range []string{"id-broken", "id-unknown-field", "id-other-kind", "id-no-version", "id-v1", "id-dir"} {
		u, ok := r.Unreadable["pulled/"+recordFile(id)]
		if !ok || !u.KubeletFails || !strings.HasSuffix(u.Path, recordFile(id)) {
			t.Errorf("%s: %+v, want unreadable by the kubelet too", id, u)
		}
	}
	if len(r.Unreadable) != 6 {
		t.Errorf("unreadable %v", r.Unreadable)
	}
	none, err := ReadPullRecords(t.TempDir())
	if err != nil || none.Enabled {
		t.Fatalf("no image_manager: %+v, %v", none, err)
	}
}

// A record is read whole as the kubelet reads it, 1 MiB or more; over imagepind's bound
// it is unreadable here, not for the kubelet.
func TestReadPullRecordsSizes(t *testing.T) {
	root := t.TempDir()
	big := pulled(t, root, "id-big", `,"credentialMapping":{"reg.example/team/private":{"kubernetesSecrets":[{"uid":"u","namespace":"default","name":"pull","credentialHash":"`+strings.Repeat("h", 2<<20)+`"}]}}`)
	r, err := ReadPullRecords(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Pulled["id-big"]; !ok || len(r.Unreadable) != 0 {
		t.Fatalf("a 2 MiB record: %v", r.Unreadable)
	}
	defer func(old int64) { maxRecordSize = old }(maxRecordSize)
	maxRecordSize = 1 << 20
	r, err = ReadPullRecords(root)
	if err != nil {
		t.Fatal(err)
	}
	if u := r.Unreadable["pulled/"+recordFile("id-big")]; u.Path != big || u.KubeletFails || !strings.Contains(u.Err, "too large") {
		t.Fatalf("over the bound: %+v", u)
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
		ver   Version
	}{
		{"gate off: nothing verified", Config{ImagePullCredentialsVerificationPolicy: AlwaysVerify, FeatureGates: map[string]bool{FeatureGate: false}}, recs, pinned, false, "", Version{}},
		{"gate unset, records dir: on", Config{ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, pinned, true, "AlwaysVerify", Version{}},
		{"default policy, pre-loaded", Config{FeatureGates: gateOn}, recs, pinned, false, "", Version{}},
		{"default policy, kubelet pulled it with a secret", Config{FeatureGates: gateOn}, recs, private, true, "pulled it itself", Version{}},
		{"default policy, kubelet pulled it anonymously", Config{FeatureGates: gateOn}, recs, anon, false, "", Version{}},
		{"default policy, an interrupted kubelet pull", Config{FeatureGates: gateOn}, recs, "reg.example/team/interrupted:1", true, "began a pull", Version{}},
		{"NeverVerify", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerify}, recs, private, false, "", Version{}},
		{"AlwaysVerify, pre-loaded", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, pinned, true, "AlwaysVerify", Version{}},
		{"AlwaysVerify, kubelet pulled it anonymously", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, anon, false, "", Version{}},
		{"AlwaysVerify, pulled with a secret: depends on the pod", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: AlwaysVerify}, recs, private, true, "are let through", Version{}},
		{"allowlisted by prefix", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"reg.example/team/*"}}, recs, pinned, false, "", Version{}},
		{"not allowlisted", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"reg.example/team/*"}}, recs, other, true, "Allowlist", Version{}},
		// The kubelet 1.35 compares an exact entry with the image string as written: a
		// digest reference never equals a name without one. The kubelet 1.36 cuts the
		// tag and digest off first: see TestKubelet136NamesImagesAsWritten.
		{"exact entry does not match a digest reference", Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"reg.example/team/app"}}, recs, pinned, true, "Allowlist", v135},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := NewVerification(c.cfg, c.recs, c.ver)
			if err != nil {
				t.Fatal(err)
			}
			a, why := v.image(c.image, ids[c.image])
			if (a == NeedsRegistry) != c.need || a == Unknown || !strings.Contains(why, c.why) {
				t.Fatalf("image = %v %q, want need %v containing %q", a, why, c.need, c.why)
			}
		})
	}
}

// The allowlist is validated as the kubelet validates it (image_pull_policies_test.go).
func TestAllowlistValidation(t *testing.T) {
	for _, bad := range []string{" a.example/*", "*", "/*", "a.example/*/x", "a.example/app:1", "a.example/app@sha256:" + strings.Repeat("1", 64), "a.example/ap*"} {
		if _, err := NewVerification(Config{ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{bad}}, PullRecords{}, Version{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := NewVerification(Config{ImagePullCredentialsVerificationPolicy: "Sometimes"}, PullRecords{}, Version{}); err == nil || !strings.Contains(err.Error(), "Sometimes") {
		t.Errorf("unknown policy: %v", err)
	}
	if _, err := NewVerification(Config{ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"a.example/app", "a.example/*"}}, PullRecords{}, Version{}); err != nil {
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
	v, err := NewVerification(Config{FeatureGates: map[string]bool{FeatureGate: true}}, recs, Version{})
	if err != nil {
		t.Fatal(err)
	}
	private := "reg.example/team/private@sha256:" + strings.Repeat("4", 64)
	other := "reg.example/team/Other@sha256:" + strings.Repeat("5", 64)
	listed := map[string]string{private: "id-secret", other: "id-other"}
	d := v.Decide([]string{other, private}, listed)
	if d.Answer != NeedsRegistry || len(d.Needs) != 1 || d.Needs[0].Image != private || !strings.Contains(d.Needs[0].Why, "pulled it itself") {
		t.Fatalf("decision %+v", d)
	}
	if d := v.Decide([]string{private}, nil); d.Answer != Starts {
		t.Fatalf("an image the runtime does not list matched a record: %+v", d)
	}
}

// An image whose record the kubelet cannot read, or that is too large to be read here, is
// never called registry-independent: the kubelet goes to the registry for it whatever the
// policy (MustAttemptImagePull), and imagepind cannot tell for one over its bound. A
// record of another image that cannot be read does not matter (the kubelet looks records
// up by the image's ID), but is said.
func TestDecideWithUnreadableRecords(t *testing.T) {
	const (
		broken  = "reg.example/team/broken@sha256:1111111111111111111111111111111111111111111111111111111111111111"
		big     = "reg.example/team/big@sha256:2222222222222222222222222222222222222222222222222222222222222222"
		huge    = "reg.example/team/huge@sha256:3333333333333333333333333333333333333333333333333333333333333333"
		fine    = "reg.example/team/fine@sha256:4444444444444444444444444444444444444444444444444444444444444444"
		pulling = "reg.example/team/pulling@sha256:5555555555555555555555555555555555555555555555555555555555555555"
	)
	listed := map[string]string{broken: "id-broken", big: "id-big", huge: "id-huge", fine: "id-fine", pulling: "id-pulling"}
	root := t.TempDir()
	write(t, filepath.Join(root, "image_manager/pulled", recordFile("id-broken")), `{"kind":"ImagePulledRecord",`)
	write(t, filepath.Join(root, "image_manager/pulling", recordFile(pulling)), `{"kind":"ImagePullIntent"}`)
	// Over 1 MiB, pulled by the kubelet with a pod's secret: read as the kubelet reads it.
	pulled(t, root, "id-big", `,"credentialMapping":{"reg.example/team/big":{"kubernetesSecrets":[{"uid":"u","namespace":"default","name":"pull","credentialHash":"`+strings.Repeat("h", 2<<20)+`"}]}}`)
	defer func(old int64) { maxRecordSize = old }(maxRecordSize)
	maxRecordSize = 3 << 20
	pulled(t, root, "id-huge", `,"credentialMapping":{"reg.example/team/huge":{"nodePodsAccessible":true,"kubernetesSecrets":[{"uid":"u","namespace":"default","name":"pull","credentialHash":"`+strings.Repeat("h", 4<<20)+`"}]}}`)
	recs, err := ReadPullRecords(root)
	if err != nil {
		t.Fatal(err)
	}
	gateOn := map[string]bool{FeatureGate: true}
	for _, c := range []struct {
		name   string
		policy string
		refs   []string
		answer Answer
		msg    []string
	}{
		{"broken record, NeverVerify", NeverVerify, []string{broken, fine}, NeedsRegistry, []string{"1 of 2 images need the registry", broken, "cannot read its pull record of it either"}},
		{"broken record, default", "", []string{broken}, NeedsRegistry, []string{broken}},
		{"broken pull intent, default", "", []string{pulling}, NeedsRegistry, []string{pulling, "pulling/" + recordFile(pulling)}},
		{"record over 1 MiB with a secret, default", "", []string{big}, NeedsRegistry, []string{big, "pulled it itself"}},
		{"record over the bound", "", []string{huge, fine}, Unknown, []string{"for 1 of 2 images it cannot be told", huge, "cannot be read here"}},
		{"both", "", []string{huge, broken}, NeedsRegistry, []string{broken, "for 1 more it cannot be told: " + huge}},
		{"others' records unreadable", "", []string{fine}, Starts, []string{"pods start from these 1 images", "3 of the kubelet's pull records cannot be read, none of them one of these images'"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := NewVerification(Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: c.policy}, recs, Version{})
			if err != nil {
				t.Fatal(err)
			}
			d := v.Decide(c.refs, listed)
			if d.Answer != c.answer {
				t.Fatalf("answer %v, want %v: %s", d.Answer, c.answer, d.Message)
			}
			for _, m := range c.msg {
				if !strings.Contains(d.Message, m) {
					t.Errorf("message %q lacks %q", d.Message, m)
				}
			}
		})
	}
}

// The kubelets whose naming the tests follow (as `kubelet --version` says).
var (
	v135 = Version{Major: 1, Minor: 35, Text: "v1.35.4", From: "fake"}
	v136 = Version{Major: 1, Minor: 36, Text: "v1.36.3", From: "fake"}
)

// The kubelet 1.36 names an image as the pod writes it, its tag and digest cut off: the
// key of its pull record's credentialMapping (docker.io/busybox, where 1.35 wrote
// docker.io/library/busybox) and what it matches against an exact allowlist entry (a
// tagged or digest image matches its name, where 1.35 compared the whole string). With
// the kubelet's version not known, an image on which the two differ cannot be told.
func TestKubelet136NamesImagesAsWritten(t *testing.T) {
	const (
		busybox = "docker.io/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111"
		app     = "reg.example/team/app:v2"
	)
	root := t.TempDir()
	// As the kubelet 1.36 writes it after pulling docker.io/busybox anonymously.
	pulled(t, root, "id-busybox", `,"credentialMapping":{"docker.io/busybox":{"nodePodsAccessible":true}}`)
	recs, err := ReadPullRecords(root)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{busybox: "id-busybox"}
	gateOn := map[string]bool{FeatureGate: true}
	allowApp := Config{FeatureGates: gateOn, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages, PreloadedImagesVerificationAllowlist: []string{"reg.example/team/app"}}
	for _, c := range []struct {
		name    string
		cfg     Config
		version Version
		ref     string
		answer  Answer
		msg     string
	}{
		{"record key, 1.36", Config{FeatureGates: gateOn}, v136, busybox, Starts, "pods start from these 1 images"},
		{"record key, 1.35", Config{FeatureGates: gateOn}, v135, busybox, NeedsRegistry, "the kubelet pulled it itself"},
		{"record key, version not known", Config{FeatureGates: gateOn}, Version{}, busybox, Unknown,
			"a kubelet before 1.36 goes to the registry for it (the kubelet pulled it itself, so it is not pre-loaded any more), a kubelet of 1.36 or later lets pods use it without the registry (they name images differently), and the kubelet's version is not known"},
		{"allowlist entry, tagged image, 1.36", allowApp, v136, app, Starts, "pods start from these 1 images"},
		{"allowlist entry, tagged image, 1.35", allowApp, v135, app, NeedsRegistry, "not in preloadedImagesVerificationAllowlist"},
		{"allowlist entry, tagged image, version not known", allowApp, Version{}, app, Unknown, "they name images differently"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := NewVerification(c.cfg, recs, c.version)
			if err != nil {
				t.Fatal(err)
			}
			d := v.Decide([]string{c.ref}, listed)
			if d.Answer != c.answer || !strings.Contains(d.Message, c.msg) {
				t.Fatalf("%v %q, want %v containing %q", d.Answer, d.Message, c.answer, c.msg)
			}
		})
	}
}

// An allowlist entry that is not fully qualified (docker.io/busybox) is refused by a
// kubelet before 1.36 and accepted from 1.36; with the version not known it is accepted,
// and the kubelet taken for 1.36 or later (an earlier one would not start with it).
func TestAllowlistValidationByVersion(t *testing.T) {
	cfg := Config{FeatureGates: map[string]bool{FeatureGate: true}, ImagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages,
		PreloadedImagesVerificationAllowlist: []string{"docker.io/busybox"}}
	if _, err := NewVerification(cfg, PullRecords{}, v135); err == nil || !strings.Contains(err.Error(), "fully qualified") || !strings.Contains(err.Error(), "kubelet v1.35.4 refuses it too") {
		t.Errorf("1.35: %v", err)
	}
	for _, version := range []Version{v136, {}} {
		v, err := NewVerification(cfg, PullRecords{}, version)
		if err != nil {
			t.Fatalf("%q: %v", version.Text, err)
		}
		if d := v.Decide([]string{"docker.io/busybox:1.36"}, nil); d.Answer != Starts {
			t.Errorf("%q: %+v", version.Text, d)
		}
	}
	cfg.PreloadedImagesVerificationAllowlist = []string{"docker.io/busybox:1.36"}
	for _, version := range []Version{v135, v136, {}} {
		if _, err := NewVerification(cfg, PullRecords{}, version); err == nil || !strings.Contains(err.Error(), "neither tag nor digest") {
			t.Errorf("%q: a tagged entry: %v", version.Text, err)
		}
	}
}

// The kubelet 1.36's trimImageTagDigest, on its own test's cases
// (image_pull_policies_test.go).
func TestTrimTagDigest(t *testing.T) {
	d := "sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd"
	for in, want := range map[string]string{
		"docker.io/busybox:1.36":               "docker.io/busybox",
		"busybox":                              "busybox",
		"localhost:5000/myimage:v1":            "localhost:5000/myimage",
		"docker.io/taghere/image:taghere":      "docker.io/taghere/image",
		"registry.io/myorg/image:tag@" + d:     "registry.io/myorg/image",
		"registry.io/" + d[7:] + "/image@" + d: "registry.io/" + d[7:] + "/image",
		"myregistry:5000/myorg/myimage:v1":     "myregistry:5000/myorg/myimage",
	} {
		if got, err := trimTagDigest(in); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "Registry.io/Image", "registry.io/myorg/@" + d} {
		if got, err := trimTagDigest(bad); err == nil {
			t.Errorf("%q accepted: %q", bad, got)
		}
	}
}
