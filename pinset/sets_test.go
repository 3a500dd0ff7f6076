package pinset

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

func TestParseBothShapes(t *testing.T) {
	text := `
# the enhancement's shape
apiVersion: machineconfiguration.openshift.io/v1alpha1
kind: PinnedImageSet
metadata: {name: upgrade-workers, uid: 550a1d88-2976-4447-9fc7-b65e457a7f42}
spec:
  nodeSelector: {matchLabels: {node-role.kubernetes.io/worker: ""}}
  pinnedImages:
  - quay.io/openshift/a@` + d1 + `
---
apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata:
  name: v1-set
  labels: {machineconfiguration.openshift.io/role: master}
  resourceVersion: "123"
spec:
  pinnedImages:
  - name: quay.io/openshift/b@` + d2 + `
status: {}
`
	res, err := ParseSetFile("upgrade.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sets) != 2 {
		t.Fatalf("sets: %d", len(res.Sets))
	}
	a, b := res.Sets[0], res.Sets[1]
	if a.UID != "550a1d88-2976-4447-9fc7-b65e457a7f42" || a.File != "upgrade.yaml" || a.Images[0] != "quay.io/openshift/a@"+d1 {
		t.Fatalf("first set: %+v", a)
	}
	if !a.Selector.Matches(map[string]string{"node-role.kubernetes.io/worker": ""}) || a.Selector.Matches(map[string]string{"node-role.kubernetes.io/master": ""}) {
		t.Fatalf("v1alpha1 selector wrong: %s", a.Selector)
	}
	if !b.Selector.Matches(map[string]string{"node-role.kubernetes.io/master": ""}) || b.Selector.Matches(map[string]string{"node-role.kubernetes.io/worker": ""}) {
		t.Fatalf("v1 role selector wrong: %s", b.Selector)
	}
	if b.UID != DerivedUID("v1-set") || b.UID != DerivedUID("v1-set") || len(b.UID) != 36 {
		t.Fatalf("derived uid %q", b.UID)
	}
	if a.SpecHash == "" || a.SpecHash == b.SpecHash {
		t.Fatalf("spec hashes %q %q", a.SpecHash, b.SpecHash)
	}
}

func TestParseListAndJSON(t *testing.T) {
	text := `{"apiVersion":"v1","kind":"List","items":[
	 {"apiVersion":"machineconfiguration.openshift.io/v1alpha1","kind":"PinnedImageSet","metadata":{"name":"a"},"spec":{"pinnedImages":["quay.io/x/a@` + d1 + `"]}},
	 {"apiVersion":"machineconfiguration.openshift.io/v1alpha1","kind":"PinnedImageSet","metadata":{"name":"b"},"spec":{"pinnedImages":["quay.io/x/b@` + d1 + `"]}}]}`
	res, err := ParseSetFile("list.json", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sets) != 2 || res.Sets[1].Name != "b" {
		t.Fatalf("%+v", res.Sets)
	}
	if !res.Sets[0].Selector.Matches(nil) {
		t.Fatal("v1alpha1 without a selector must apply to every node")
	}
}

func TestV1WithoutRoleAppliesNowhere(t *testing.T) {
	text := `apiVersion: machineconfiguration.openshift.io/v1
kind: PinnedImageSet
metadata: {name: orphan}
spec: {pinnedImages: [{name: "quay.io/x/a@` + d1 + `"}]}`
	res, err := ParseSetFile("o.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if res.Sets[0].Selector.Matches(map[string]string{"node-role.kubernetes.io/worker": ""}) {
		t.Fatal("a v1 set without a role label must apply to no node")
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "applies to no node") {
		t.Fatalf("warnings: %q", res.Warnings)
	}
}

func TestMatchExpressions(t *testing.T) {
	text := `apiVersion: machineconfiguration.openshift.io/v1alpha1
kind: PinnedImageSet
metadata: {name: expr}
spec:
  nodeSelector:
    matchLabels: {zone: a}
    matchExpressions:
    - {key: tier, operator: In, values: [edge, core]}
    - {key: maintenance, operator: DoesNotExist}
    - {key: gpu, operator: Exists}
    - {key: arch, operator: NotIn, values: [s390x]}
  pinnedImages: ["quay.io/x/a@` + d1 + `"]`
	res, err := ParseSetFile("e.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	sel := res.Sets[0].Selector
	base := func() map[string]string {
		return map[string]string{"zone": "a", "tier": "edge", "gpu": "", "arch": "amd64"}
	}
	if !sel.Matches(base()) {
		t.Fatal("should match")
	}
	for name, mutate := range map[string]func(map[string]string){
		"wrong zone":    func(m map[string]string) { m["zone"] = "b" },
		"tier not In":   func(m map[string]string) { m["tier"] = "lab" },
		"maintenance":   func(m map[string]string) { m["maintenance"] = "" },
		"no gpu":        func(m map[string]string) { delete(m, "gpu") },
		"arch in NotIn": func(m map[string]string) { m["arch"] = "s390x" },
	} {
		l := base()
		mutate(l)
		if sel.Matches(l) {
			t.Errorf("%s: should not match", name)
		}
	}
}

func TestParseErrorsNameFileDocumentField(t *testing.T) {
	head := "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\n"
	cases := map[string]struct{ text, want string }{
		"tag": {head + "metadata: {name: s}\nspec: {pinnedImages: [quay.io/x/a:latest]}",
			`bad.yaml: document 1 (set "s"): spec.pinnedImages[0]: "quay.io/x/a:latest" is not by digest`},
		"tag conflict": {head + "metadata: {name: s}\nspec: {pinnedImages: [\"quay.io/x/a:v1@" + d1 + "\", \"quay.io/x/a:v1@" + d2 + "\"]}",
			`spec.pinnedImages[1]: tag quay.io/x/a:v1 is also spec.pinnedImages[0] with another digest (quay.io/x/a@` + d1 + `): a tag names one image`},
		"tag unqualified": {head + "metadata: {name: s}\nspec: {pinnedImages: [\"busybox:1@" + d1 + "\"]}",
			`is not fully qualified: write it as "docker.io/library/busybox:1@` + d1 + `"`},
		"unqualified": {head + "metadata: {name: s}\nspec: {pinnedImages: [\"busybox@" + d1 + "\"]}",
			`is not fully qualified: write it as "docker.io/library/busybox@` + d1 + `"`},
		"duplicate image": {head + "metadata: {name: s}\nspec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\", \"quay.io/x/a@" + d1 + "\"]}",
			`spec.pinnedImages[1]: "quay.io/x/a@` + d1 + `" duplicates spec.pinnedImages[0]`},
		"bad name":      {head + "metadata: {name: ../etc}\nspec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\"]}", `metadata.name: "../etc" is not a DNS-1123 subdomain`},
		"missing name":  {head + "spec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\"]}", `document 1: metadata.name: missing`},
		"unknown field": {head + "metadata: {name: s}\nspec: {pinnedImage: [\"quay.io/x/a@" + d1 + "\"]}", `spec: json: unknown field "pinnedImage"`},
		"no images":     {head + "metadata: {name: s}\nspec: {pinnedImages: []}", `spec.pinnedImages: no images (and no spec.releaseImage)`},
		"kind":          {"apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: ConfigMap\nmetadata: {name: s}\nspec: {}", `kind: "ConfigMap" is not PinnedImageSet`},
		"bad operator": {head + "metadata: {name: s}\nspec: {nodeSelector: {matchExpressions: [{key: a, operator: Gt, values: [\"1\"]}]}, pinnedImages: [\"quay.io/x/a@" + d1 + "\"]}",
			`spec.nodeSelector: matchExpressions[0].operator: "Gt" is not In, NotIn, Exists or DoesNotExist`},
		"empty":           {"", "no PinnedImageSet document"},
		"comments only":   {"# nothing\n---\n", "no PinnedImageSet document"},
		"duplicate names": {head + "metadata: {name: s}\nspec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\"]}\n---\n" + head + "metadata: {name: s}\nspec: {pinnedImages: [\"quay.io/x/b@" + d1 + "\"]}", `document 2 (set "s"): metadata.name: set "s" is also defined by document 1`},
		"toml injection":  {head + "metadata: {name: s}\nspec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\\\"]\\n[crio.runtime]\\nx = \\\"\"]}", "is not a valid image reference"},
		"upper-case path": {head + "metadata: {name: s}\nspec: {pinnedImages: [\"quay.io/X/a:v1@" + d1 + "\"]}", `spec.pinnedImages[0]: "quay.io/X/a:v1@` + d1 + `" is not a valid image reference: invalid reference format: repository name (X/a) must be lowercase`},
		"bare star":       {head + "metadata: {name: s}\nspec: {pinnedImages: [\"*\"]}", "is not a valid image reference"},
		"invalid utf8":    {head + "metadata: {name: \"s\xff\"}\n", "not valid UTF-8"},
		"v1 nodeSelector": {"apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata: {name: s}\nspec: {nodeSelector: {}, pinnedImages: [{name: \"quay.io/x/a@" + d1 + "\"}]}", "spec.nodeSelector: not part of"},
		"truncated":       {head + "metadata: {name: s}\nspec:\n  pinnedImages: [\"quay.io/x/a@sha256:1111", "bad.yaml: document 1"},
	}
	for name, c := range cases {
		_, err := ParseSetFile("bad.yaml", []byte(c.text))
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "bad.yaml: ") {
			t.Errorf("%s: error %q does not contain %q", name, err, c.want)
		}
	}
}

func TestTooManyImages(t *testing.T) {
	var b strings.Builder
	b.WriteString("apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: big}\nspec:\n  pinnedImages:\n")
	for i := 0; i <= MaxImagesPerSet; i++ {
		b.WriteString("  - quay.io/x/a" + itoa(i) + "@" + d1 + "\n")
	}
	_, err := ParseSetFile("big.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "2001 images, at most 2000") {
		t.Fatalf("got %v", err)
	}
}

func itoa(i int) string {
	s := ""
	for {
		s = string(rune('0'+i%10)) + s
		i /= 10
		if i == 0 {
			return s
		}
	}
}

func TestUniqueNamesAcrossFiles(t *testing.T) {
	files := []FileSets{
		{File: "a.yaml", Sets: []Set{{Name: "x"}}},
		{File: "b.yaml", Sets: []Set{{Name: "y"}, {Name: "x"}}},
		{File: "c.yaml", Sets: []Set{{Name: "y"}}},
	}
	kept, errs := UniqueNames(files)
	if len(kept) != 2 || kept[0].File != "a.yaml" || kept[1].File != "c.yaml" {
		t.Fatalf("kept %+v", kept)
	}
	if err := errs["b.yaml"]; err == nil || !strings.Contains(err.Error(), `set "x" is already defined in a.yaml`) {
		t.Fatalf("errs %v", errs)
	}
}

func TestIsSetFileName(t *testing.T) {
	for name, want := range map[string]bool{
		"a.yaml": true, "b.yml": true, "c.json": true, "D.YAML": true,
		".a.yaml": false, "..data": false, "a.yaml~": false, "a.yaml.swp": false, ".a.yaml.swp": false,
		"#a.yaml#": false, "a.yaml.bak": false, "a.txt": false, "..2024_01_01": false,
	} {
		if got := IsSetFileName(name); got != want {
			t.Errorf("IsSetFileName(%q) = %v, want %v", name, got, want)
		}
	}
}

// A ConfigMap volume: files are symlinks into a ..data symlink to a timestamped directory.
func TestReadSetsDirConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	ts := filepath.Join(dir, "..2026_11_21_09_00_00.1")
	os.Mkdir(ts, 0o755)
	doc := "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: cm}\nspec: {pinnedImages: [\"quay.io/x/a@" + d1 + "\"]}\n"
	os.WriteFile(filepath.Join(ts, "cm.yaml"), []byte(doc), 0o644)
	os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data"))
	os.Symlink("..data/cm.yaml", filepath.Join(dir, "cm.yaml"))
	os.Symlink("..data/gone.yaml", filepath.Join(dir, "gone.yaml")) // dangling: skipped
	files, err := ReadSetsDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0].Name != "cm.yaml" || files[0].Err != nil || string(files[0].Data) != doc {
		t.Fatalf("%+v", files)
	}
	if _, err := ReadSetsDir(filepath.Join(dir, "nope"), false); !errors.Is(err, ErrSetsDirMissing) {
		t.Fatalf("missing dir: %v", err)
	}
}

func TestReleaseImageFields(t *testing.T) {
	head := "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: r}\n"
	res, err := ParseSetFile("r.yaml", []byte(head+"spec: {releaseImage: \"quay.io/openshift-release-dev/ocp-release@"+d1+"\", osImageStream: rhel-10}"))
	if err != nil {
		t.Fatal(err)
	}
	s := res.Sets[0]
	if s.ReleaseImage == "" || s.OSImageStream != "rhel-10" || len(s.Images) != 0 {
		t.Fatalf("%+v", s)
	}
	other, _ := ParseSetFile("r.yaml", []byte(head+"spec: {releaseImage: \"quay.io/openshift-release-dev/ocp-release@"+d1+"\"}"))
	if other.Sets[0].SpecHash == s.SpecHash {
		t.Fatal("the stream must change the spec hash")
	}
	for text, want := range map[string]string{
		head + "spec: {releaseImage: \"quay.io/ocp/release:4.20\"}":                                   "spec.releaseImage: \"quay.io/ocp/release:4.20\" is not by digest",
		head + "spec: {osImageStream: rhel-10, pinnedImages: [\"quay.io/x/a@" + d1 + "\"]}":           "spec.osImageStream: only with spec.releaseImage",
		head + "spec: {releaseImage: \"quay.io/ocp/release@" + d1 + "\", osImageStream: \"RHEL 10\"}": "spec.osImageStream: \"RHEL 10\"",
	} {
		if _, err := ParseSetFile("r.yaml", []byte(text)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v", text, err)
		}
	}
}

func TestClusterFileNameFitsAndIsUnique(t *testing.T) {
	short := "upgrade-workers"
	if got := ClusterFileName(short); got != short+".json" {
		t.Fatalf("short name: %s", got)
	}
	long1 := strings.Repeat("a", 253)
	long2 := strings.Repeat("a", 252) + "b"
	f1, f2 := ClusterFileName(long1), ClusterFileName(long2)
	if len(f1) > 255 || len(f2) > 255 || f1 == f2 || !IsSetFileName(f1) {
		t.Fatalf("long names: %q (%d) %q (%d)", f1, len(f1), f2, len(f2))
	}
	// The hashed form has a character no object name may have: no short name maps there.
	if !strings.Contains(f1, "_") || ClusterFile(long1) != "cluster/"+f1 {
		t.Fatalf("hashed form %q", f1)
	}
}
