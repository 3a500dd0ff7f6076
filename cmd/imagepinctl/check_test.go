package main

import (
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
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
		"set upgrade: ADMITTED — 2 of 2 images missing",
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
	if !strings.Contains(errOut, "CRI-O not reachable") {
		t.Errorf("stderr: %s", errOut)
	}
	code, out, _ = ctl(t, "check", "--config", cfg, "--storage", dir, "-o", "json", set)
	if code != 1 || !strings.Contains(out, `"endpoint": "`+host+`/team/app"`) {
		t.Fatalf("json %d:\n%s", code, out)
	}
}
