package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/test/registrytest"
)

// resolveWorld is a registry reached only through a registries.conf mirror of
// upstream.example.invalid, over TLS with its CA in certs.d, with basic auth whose
// credentials the pull secret holds: the node's registry access.
func resolveWorld(t *testing.T) (reg *registrytest.Registry, cfg string, tags map[string]string) {
	t.Helper()
	reg = registrytest.New(t, map[string]string{"team": "puller:s3cret"})
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs.d")
	reg.WriteCA(certs)
	regConf := write(t, dir, "registries.conf", fmt.Sprintf(`[[registry]]
prefix = "upstream.example.invalid/team"
location = "upstream.example.invalid/team"
[[registry.mirror]]
location = "%s/team"
`, reg.Host))
	// The mirror's credentials by its host, as in an OpenShift pull secret (CRI-O's global_auth_file).
	secret := write(t, dir, "pull-secret.json", fmt.Sprintf(`{"auths": {"upstream.example.invalid": {"username": "other", "password": "x"}, %q: {"auth": %q}}}`,
		reg.Host, base64.StdEncoding.EncodeToString([]byte("puller:s3cret"))))
	cfg = write(t, dir, "c.toml", fmt.Sprintf("[cri]\npull_secret = %q\n[disk]\nregistries_conf = %q\nregistries_conf_dir = %q\ncerts_dir = %q\n",
		secret, regConf, filepath.Join(dir, "none.d"), certs))

	img := func() v1.Image {
		i, err := random.Image(3000, 1)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: img(), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: img(), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	const up = "upstream.example.invalid/"
	tags = map[string]string{
		"app:1.2": up + reg.PushIndex("team/app", idx, "puller:s3cret", "1.2"),
		"db:16":   up + reg.Push("team/db", img(), "puller:s3cret", "16", "latest"),
		"web:3":   up + reg.Push("team/web", img(), "puller:s3cret", "3"),
	}
	return reg, cfg, tags
}

func TestResolveTagsThroughMirrorCertsAndAuth(t *testing.T) {
	_, cfg, tags := resolveWorld(t)
	dir := t.TempDir()
	pinned := "upstream.example.invalid/team/kept@sha256:" + strings.Repeat("a", 64)
	set := write(t, dir, "apps.yaml", `# apps for the edge pool
apiVersion: imagepin.io/v1alpha1
kind: PinnedImageSet
metadata:
  name: apps
spec:
  nodeSelector:
    matchLabels:
      node-role.kubernetes.io/edge: ""
  pinnedImages:
    - name: upstream.example.invalid/team/app:1.2   # multi-arch
    - name: upstream.example.invalid/team/db
    - name: `+pinned+`
    - name: upstream.example.invalid/team/web:3@`+strings.TrimPrefix(tags["web:3"], "upstream.example.invalid/team/web@")+`
`)
	code, out, errOut := ctl(t, "resolve", set, "--config", cfg) // flags after files
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	res, err := pinset.ParseSetFile("out.yaml", []byte(out))
	if err != nil {
		t.Fatalf("output is not a valid set: %v\n%s", err, out)
	}
	want := []string{tags["app:1.2"], tags["db:16"], pinned, tags["web:3"]}
	if got := res.Sets[0].Images; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("images %v\nwant %v", got, want)
	}
	for _, keep := range []string{"# apps for the edge pool", "# multi-arch", `node-role.kubernetes.io/edge: ""`} {
		if !strings.Contains(out, keep) {
			t.Errorf("lost %q:\n%s", keep, out)
		}
	}
	for _, line := range []string{
		`apps.yaml: set "apps": spec.pinnedImages[0].name: upstream.example.invalid/team/app:1.2 → ` + tags["app:1.2"] + ` (manifest list: linux/amd64, linux/arm64)`,
		`spec.pinnedImages[1].name: upstream.example.invalid/team/db → ` + tags["db:16"] + ` (no tag: resolved :latest)`,
		`spec.pinnedImages[3].name: upstream.example.invalid/team/web:3@sha256:`,
		`(tag dropped: CRI-O pulls by the digest alone)`,
		"3 references resolved to digests, 1 already by digest, 1 files",
	} {
		if !strings.Contains(errOut, line) {
			t.Errorf("stderr lacks %q:\n%s", line, errOut)
		}
	}
	if strings.Contains(errOut, "s3cret") || strings.Contains(out, "s3cret") {
		t.Fatal("the password reached the output")
	}

	// --write: in place, atomically; a second run changes nothing.
	code, _, errOut = ctl(t, "resolve", "--config", cfg, "--write", set)
	if code != 0 || !strings.Contains(errOut, "apps.yaml: written") {
		t.Fatalf("write: %d\n%s", code, errOut)
	}
	if data, _ := os.ReadFile(set); string(data) != out {
		t.Fatalf("written file differs from the printed one:\n%s", data)
	}
	code, _, errOut = ctl(t, "resolve", "--config", cfg, "-w", set)
	if code != 0 || strings.Contains(errOut, "written") || !strings.Contains(errOut, "0 references resolved to digests, 4 already by digest") {
		t.Fatalf("second write: %d\n%s", code, errOut)
	}

	// A JSON file stays JSON with --write; -o json merges files into one List.
	js := write(t, dir, "web.json", `{"apiVersion": "machineconfiguration.openshift.io/v1alpha1", "kind": "PinnedImageSet",
 "metadata": {"name": "web"}, "spec": {"pinnedImages": ["upstream.example.invalid/team/web:3"]}}`)
	if code, _, errOut := ctl(t, "resolve", "--config", cfg, "-w", js); code != 0 {
		t.Fatalf("json write: %d %s", code, errOut)
	}
	if data, _ := os.ReadFile(js); !strings.HasPrefix(string(data), "{") || !strings.Contains(string(data), tags["web:3"]) {
		t.Fatalf("json file:\n%s", data)
	}
	code, out, _ = ctl(t, "resolve", "--config", cfg, "-o", "json", set, js)
	if code != 0 || !strings.Contains(out, `"kind": "List"`) || strings.Count(out, `"kind": "PinnedImageSet"`) != 2 {
		t.Fatalf("-o json: %d\n%s", code, out)
	}

	// A plain list of tags becomes a set for --selector.
	list := write(t, dir, "edge-apps.txt", "# what the edge runs\nupstream.example.invalid/team/app:1.2\nupstream.example.invalid/team/db:16\n")
	code, out, errOut = ctl(t, "resolve", "--config", cfg, "--selector", "node-role.kubernetes.io/edge=", list)
	if code != 0 {
		t.Fatalf("list: %d\n%s", code, errOut)
	}
	res, err = pinset.ParseSetFile("list.yaml", []byte(out))
	if err != nil || res.Sets[0].Name != "edge-apps" || len(res.Sets[0].Images) != 2 ||
		!res.Sets[0].Selector.Matches(map[string]string{"node-role.kubernetes.io/edge": ""}) ||
		res.Sets[0].Selector.Matches(map[string]string{"node-role.kubernetes.io/worker": ""}) {
		t.Fatalf("list: %v %+v\n%s", err, res, out)
	}
	if code, _, errOut := ctl(t, "resolve", "--config", cfg, "-w", list); code != 1 || !strings.Contains(errOut, "a list of images, not a set file") {
		t.Fatalf("list -w: %d %s", code, errOut)
	}
}

// Any reference that does not resolve fails the whole run, names the file, set and
// field, and nothing is written.
func TestResolveFailuresWriteNothing(t *testing.T) {
	_, cfg, _ := resolveWorld(t)
	dir := t.TempDir()
	body := `apiVersion: imagepin.io/v1alpha1
kind: PinnedImageSet
metadata: {name: apps}
spec:
  nodeSelector: {}
  pinnedImages:
  - upstream.example.invalid/team/app:1.2
  - upstream.example.invalid/team/app:9.9
  - busybox:1.36
`
	set := write(t, dir, "apps.yaml", body)
	code, out, errOut := ctl(t, "resolve", "--config", cfg, "-w", set)
	if code != 1 || out != "" {
		t.Fatalf("exit %d out %q", code, out)
	}
	for _, want := range []string{
		`apps.yaml: set "apps": spec.pinnedImages[1]: cannot resolve:`,
		"upstream.example.invalid/team/app:9.9",
		`spec.pinnedImages[2]: cannot resolve: "busybox:1.36" is not fully qualified: write it as "docker.io/library/busybox:1.36"`,
		"nothing written",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if data, _ := os.ReadFile(set); string(data) != body {
		t.Fatal("the file changed")
	}
	// Not a set at all, and a bad selector.
	bad := write(t, dir, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
	if code, _, errOut := ctl(t, "resolve", "--config", cfg, bad); code != 1 || !strings.Contains(errOut, `cm.yaml: document 1: kind: "ConfigMap", want PinnedImageSet`) {
		t.Fatalf("configmap: %d %s", code, errOut)
	}
	if code, _, errOut := ctl(t, "resolve", "--config", cfg, "--selector", "a in (", set); code != 2 || !strings.Contains(errOut, "--selector") {
		t.Fatalf("selector: %d %s", code, errOut)
	}
}

// --keep-tags writes repository:tag@sha256:… for every pinned image that named a tag (a
// set the nodes also pre-load the tags of), never for a reference without a tag or a
// release image, and the result is a valid set whose tags pinset reads.
func TestResolveKeepTags(t *testing.T) {
	_, cfg, tags := resolveWorld(t)
	dir := t.TempDir()
	digestOf := func(ref string) string { _, d, _ := strings.Cut(ref, "@"); return d }
	set := write(t, dir, "apps.yaml", `apiVersion: imagepin.io/v1alpha1
kind: PinnedImageSet
metadata: {name: apps}
spec:
  nodeSelector: {}
  pinnedImages:
    - name: upstream.example.invalid/team/app:1.2
    - name: upstream.example.invalid/team/db
    - name: upstream.example.invalid/team/web:3@`+digestOf(tags["web:3"])+`
`)
	code, out, errOut := ctl(t, "resolve", "--keep-tags", "--config", cfg, set)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	res, err := pinset.ParseSetFile("out.yaml", []byte(out))
	if err != nil {
		t.Fatalf("output is not a valid set: %v\n%s", err, out)
	}
	s := res.Sets[0]
	wantTags := []pinset.Tag{
		{Name: "upstream.example.invalid/team/app:1.2", Image: tags["app:1.2"]},
		{Name: "upstream.example.invalid/team/web:3", Image: tags["web:3"]},
	}
	if len(s.Tags) != 2 || s.Tags[0] != wantTags[0] || s.Tags[1] != wantTags[1] {
		t.Fatalf("tags %+v, want %+v\n%s", s.Tags, wantTags, out)
	}
	if !strings.Contains(out, "upstream.example.invalid/team/db@"+digestOf(tags["db:16"])) || strings.Contains(out, "team/db:latest") {
		t.Fatalf("a reference without a tag got one:\n%s", out)
	}
	if !strings.Contains(errOut, "tag kept: the nodes pre-load it as this digest") || !strings.Contains(errOut, "2 references resolved to digests, 1 already by digest") {
		t.Fatalf("stderr:\n%s", errOut)
	}
}
