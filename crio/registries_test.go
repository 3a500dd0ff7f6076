package crio

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"
)

// The drop-in, read back by containers/image itself together with the administrator's
// files: for a digest pull the node-local mirror comes first, then the administrator's
// mirror (rewritten for the repository), then the source; a tag pull skips ours.
func TestMirrorDropInKeepsTheAdministratorsMirrors(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "registries.conf")
	dropIns := filepath.Join(dir, "registries.conf.d")
	os.MkdirAll(dropIns, 0o755)
	os.WriteFile(main, []byte(`unqualified-search-registries = []
[[registry]]
prefix = "quay.io/openshift-release-dev"
location = "quay.io/openshift-release-dev"
[[registry.mirror]]
location = "mirror.example:5000/ocp"
`), 0o644)
	os.WriteFile(filepath.Join(dropIns, "50-wildcard.conf"), []byte(`[[registry]]
prefix = "*.corp.example"
location = ""
[[registry.mirror]]
location = "cache.corp.example"
pull-from-mirror = "digest-only"
`), 0o644)
	files := &AdminFiles{Main: main, Dir: dropIns, Scratch: filepath.Join(dir, "scratch")}
	admin, changed, err := files.Read()
	if err != nil || !changed {
		t.Fatal(changed, err)
	}
	repos := []string{"quay.io/openshift-release-dev/ocp-v4.0-art-dev", "a.corp.example/team/app", "docker.io/library/busybox", "quay.io/openshift-release-dev/ocp-v4.0-art-dev"}
	data, err := MirrorDropIn("127.0.0.1:7443", repos, admin, func(r string) string { return r })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("drop-in:\n%s", data)
	if err := os.WriteFile(filepath.Join(dropIns, MirrorDropInName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sys := &types.SystemContext{SystemRegistriesConfPath: main, SystemRegistriesConfDirPath: dropIns}
	sysregistriesv2.InvalidateCache()
	sources := func(ref string) []string {
		t.Helper()
		named, err := reference.ParseNormalizedNamed(ref)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := sysregistriesv2.FindRegistry(sys, named.String())
		if err != nil || reg == nil {
			t.Fatalf("%s: %v %v", ref, reg, err)
		}
		ps, err := reg.PullSourcesFromReference(named)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range ps {
			out = append(out, p.Reference.String())
		}
		return out
	}
	const sum = "@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	for ref, want := range map[string][]string{
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev" + sum: {
			"127.0.0.1:7443/quay.io/openshift-release-dev/ocp-v4.0-art-dev" + sum,
			"mirror.example:5000/ocp/ocp-v4.0-art-dev" + sum,
			"quay.io/openshift-release-dev/ocp-v4.0-art-dev" + sum},
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev:4.20": {
			"mirror.example:5000/ocp/ocp-v4.0-art-dev:4.20",
			"quay.io/openshift-release-dev/ocp-v4.0-art-dev:4.20"},
		"a.corp.example/team/app" + sum: {
			"127.0.0.1:7443/a.corp.example/team/app" + sum,
			"cache.corp.example/team/app" + sum,
			"a.corp.example/team/app" + sum},
		"docker.io/library/busybox" + sum: {
			"127.0.0.1:7443/docker.io/library/busybox" + sum,
			"docker.io/library/busybox" + sum},
	} {
		if got := sources(ref); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", ref, got, want)
		}
	}
	// Read again with ours in place: the administrator's view leaves ours out, and
	// nothing of theirs changed.
	admin, changed, err = files.Read()
	if err != nil || changed {
		t.Fatalf("second read: changed %v, %v", changed, err)
	}
	again, err := MirrorDropIn("127.0.0.1:7443", repos, admin, func(r string) string { return r })
	if err != nil || string(again) != string(data) {
		t.Fatalf("rendering again with our drop-in present differs (%v):\n%s", err, again)
	}
}
