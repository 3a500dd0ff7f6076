package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/imagepin/imagepin/cmd/internal/wire"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/release/releasetest"
	"github.com/imagepin/imagepin/status"
)

func TestCheckThroughAMirrorWithoutCRIO(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img, err := random.Image(50000, 2)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	ref, _ := name.ParseReference(host+"/team/app@"+d.String(), name.Insecure)
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	regConf := write(t, dir, "registries.conf", fmt.Sprintf(`[[registry]]
prefix = "upstream.example.invalid/team"
location = "upstream.example.invalid/team"
[[registry.mirror]]
location = "%s/team"
insecure = true
pull-from-mirror = "digest-only"
`, host))
	cfg := write(t, dir, "c.toml", fmt.Sprintf(`[node]
name = "w1"
labels_file = ""
[cri]
endpoint = "unix://%s"
[disk]
registries_conf = %q
registries_conf_dir = %q
certs_dir = %q
kubelet_config = ""
gc_high_threshold_percent = 100
`, filepath.Join(dir, "no.sock"), regConf, filepath.Join(dir, "none.d"), filepath.Join(dir, "certs.d")))
	good := "upstream.example.invalid/team/app@" + d.String()
	gone := "upstream.example.invalid/team/gone@sha256:" + strings.Repeat("0", 64)
	set := write(t, dir, "s.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: upgrade}\nspec:\n  pinnedImages:\n  - "+good+"\n  - "+gone+"\n")

	code, out, errOut := ctl(t, "check", "--config", cfg, "--storage", dir, set)
	if code != 1 {
		t.Fatalf("exit %d; out:\n%s\nerr:\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"node w1 (linux/amd64), image filesystem " + dir,
		"set upgrade: UNREACHABLE — 2 of 2 images missing", // not ADMITTED above an image that cannot be reached
		"; 1 of them cannot be reached",
		"✓ " + good,
		"from " + host + "/team/app",
		"✗ " + gone,
		host + "/team/gone", // every endpoint tried is named
		"upstream.example.invalid/team/gone",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "container runtime not reachable") {
		t.Errorf("stderr: %s", errOut)
	}
	code, out, _ = ctl(t, "check", "--config", cfg, "--storage", dir, "-o", "json", set)
	if code != 1 || !strings.Contains(out, `"endpoint": "`+host+`/team/app"`) {
		t.Fatalf("json %d:\n%s", code, out)
	}
}

// A set naming a release is checked for the images imagepind would expand it to on this
// node; a release that cannot be read makes the set REFUSED and the exit 1 (it used to
// say "0 of 0 images missing … ADMITTED").
func TestCheckExpandsReleaseSets(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	p, err := releasetest.Push(context.Background(), releasetest.Options{PushHost: host, RefHost: "upstream.example.invalid", Repo: "ocp/release",
		Version: "4.20.1", Components: 5})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	regConf := write(t, dir, "registries.conf", fmt.Sprintf("[[registry]]\nprefix = \"upstream.example.invalid/ocp\"\nlocation = \"upstream.example.invalid/ocp\"\n[[registry.mirror]]\nlocation = \"%s/ocp\"\ninsecure = true\npull-from-mirror = \"digest-only\"\n", host))
	cfg := write(t, dir, "c.toml", fmt.Sprintf("[node]\nname = \"w1\"\nlabels_file = \"\"\n[cri]\nendpoint = \"unix://%s\"\npull_secret = \"\"\n[disk]\nregistries_conf = %q\nregistries_conf_dir = %q\ncerts_dir = %q\nkubelet_config = \"\"\ngc_high_threshold_percent = 100\n",
		filepath.Join(dir, "no.sock"), regConf, filepath.Join(dir, "none"), filepath.Join(dir, "certs")))
	set := write(t, dir, "up.yaml", "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: upgrade}\nspec:\n  nodeSelector: {}\n  releaseImage: "+p.Release+"\n")
	code, out, errOut := ctl(t, "check", "--config", cfg, "--storage", dir, "--labels", "node-role.kubernetes.io/worker=", set)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "set upgrade: ADMITTED — 7 of 7 images missing") || !strings.Contains(out, "release 4.20.1 ("+p.Release+"): 7 images for this node") {
		t.Fatalf("release not expanded:\n%s", out)
	}
	gone := write(t, dir, "gone.yaml", "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: gone}\nspec:\n  nodeSelector: {}\n  releaseImage: upstream.example.invalid/ocp/release@sha256:"+strings.Repeat("9", 64)+"\n")
	code, out, _ = ctl(t, "check", "--config", cfg, "--storage", dir, gone)
	if code != 1 || !strings.Contains(out, "set gone: REFUSED") || !strings.Contains(out, "ReleaseUnavailable: release upstream.example.invalid/ocp/release@sha256:9999") {
		t.Fatalf("unreachable release: exit %d\n%s", code, out)
	}
}

// everyBlobHeld is an aggregator counting two holders of every blob.
func everyBlobHeld(images []string) status.BlobHolders {
	return status.BlobHolders{Status: status.True, Images: len(images), Blobs: 3 * len(images)}
}

// --registry-gone on a node whose kubelet has not started yet (no image_manager) under
// AlwaysVerify: ready only when the kubelet's version says its credential verification
// is off, or the config turns it off; a kubelet 1.35 (on by default) needs the registry,
// and a version that cannot be read leaves it unknown — never ready.
func TestRegistryGoneBeforeTheKubeletsFirstStart(t *testing.T) {
	const app = "reg.example/team/app@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	dir := t.TempDir()
	script := func(name, version string) string {
		return write(t, dir, name, "#!/bin/sh\necho 'Kubernetes "+version+"'\n")
	}
	for _, c := range []struct {
		name, config, binary string
		ready                bool
		kubelet, why         string
	}{
		{"kubelet 1.35.4", "", script("kubelet-135", "v1.35.4"), false, "NeedsRegistry", "AlwaysVerify: 1 of 1 images need the registry"},
		{"no kubelet binary", "", filepath.Join(dir, "none"), false, "Unknown", "cannot be told"},
		{"binary not configured", "", "", false, "Unknown", "cannot be told"},
		{"kubelet 1.34.2", "", script("kubelet-134", "v1.34.2"), true, "Starts", ""},
		{"explicit false, kubelet 1.35.4", "featureGates: {KubeletEnsureSecretPulledImages: false}\n", script("kubelet-135b", "v1.35.4"), true, "Starts", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := conf.Default()
			cfg.Disk.KubeletConfig = write(t, t.TempDir(), "kubelet.conf",
				"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimagePullCredentialsVerificationPolicy: AlwaysVerify\n"+c.config)
			cfg.Kubelet.ConfigDir = ""
			cfg.Kubelet.RootDir = t.TempDir()
			cfg.Kubelet.Binary = c.binary
			if c.binary != "" {
				_ = os.Chmod(c.binary, 0o755)
			}
			v, err := wire.Kubelet(cfg)()
			rg := nodeFacts{ids: map[string]string{app: "id-app"}, v: v, verr: err, holders: everyBlobHeld}.registryGone(pinset.Set{Images: []string{app}}, nil, nil, "")
			if rg.Ready != c.ready || rg.Kubelet != c.kubelet || !strings.Contains(strings.Join(rg.Why, "\n"), c.why) {
				t.Fatalf("%+v; want ready %v, kubelet %s, why containing %q", rg, c.ready, c.kubelet, c.why)
			}
		})
	}
}

// A set pinning reg.example/team/a:v2 is ready to lose its registry only when the runtime
// lists that tag as the pinned digest's image: not when it lacks the tag, nor when the
// tag names another image (taken from a registry where it moved). The words are
// imagepind's (agent.TestAgentSaysWhenAPinnedTagIsNotHeld).
func TestRegistryGoneWhenAPinnedTagIsNotHeld(t *testing.T) {
	const tagNotHeld = "1 of 1 pinned tags are not held by the runtime as their pinned digests: reg.example/team/a:v2 (pods naming them would need the registry)"
	res, err := pinset.ParseSetFile("apps.yaml", []byte("apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: apps}\nspec:\n  nodeSelector: {}\n  pinnedImages:\n"+
		"  - reg.example/team/a:v2@sha256:"+strings.Repeat("1", 64)+"\n  - reg.example/team/b@sha256:"+strings.Repeat("2", 64)+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	set := res.Sets[0]
	a, b := set.Images[0], set.Images[1]
	cfg := conf.Default()
	cfg.Disk.KubeletConfig = write(t, t.TempDir(), "kubelet.conf", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates: {KubeletEnsureSecretPulledImages: true}\n")
	cfg.Kubelet.ConfigDir, cfg.Kubelet.RootDir, cfg.Kubelet.Binary = "", t.TempDir(), ""
	v, verr := wire.Kubelet(cfg)()
	if verr != nil {
		t.Fatal(verr)
	}
	for _, c := range []struct {
		name  string
		ids   map[string]string
		ready bool
	}{
		{"the tag not listed", map[string]string{a: "id-a", b: "id-b"}, false},
		{"the tag names another image", map[string]string{a: "id-a", b: "id-b", "reg.example/team/a:v2": "id-other"}, false},
		{"the tag held", map[string]string{a: "id-a", b: "id-b", "reg.example/team/a:v2": "id-a"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rg := nodeFacts{ids: c.ids, v: v, holders: everyBlobHeld}.registryGone(set, nil, nil, "")
			if c.ready {
				if !rg.Ready || rg.Status != status.True || rg.Reason != status.ReasonPodsStartWithoutRegistry || len(rg.Why) != 0 {
					t.Fatalf("%+v", rg)
				}
				return
			}
			if rg.Ready || rg.Status != status.False || rg.Reason != status.ReasonTagsNotHeld || len(rg.Why) != 1 || rg.Why[0] != tagNotHeld || rg.Message != tagNotHeld {
				t.Fatalf("%+v; want False/TagsNotHeld %q", rg, tagNotHeld)
			}
			var out strings.Builder
			printPlan(&out, checkReport{Sets: []setPlan{{Set: "apps", Admitted: true, RegistryGone: rg}}})
			if !strings.Contains(out.String(), "registry gone: NOT READY (TagsNotHeld)\n      "+tagNotHeld+"\n"+
				"    on this node: pods would need the registry when they start (TagsNotHeld)\n    for a node joining or replacing one: every blob held by 2 nodes or more\n") {
				t.Fatalf("printed:\n%s", out.String())
			}
		})
	}
}
