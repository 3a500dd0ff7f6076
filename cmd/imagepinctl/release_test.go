package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/release/releasetest"
)

func TestReleaseSets(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	p, err := releasetest.Push(context.Background(), releasetest.Options{PushHost: host, RefHost: "upstream.example.invalid", Repo: "ocp/release",
		Version: "4.20.1", Components: 600, Multi: false})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	regConf := write(t, dir, "registries.conf", fmt.Sprintf("[[registry]]\nprefix = \"upstream.example.invalid/ocp\"\nlocation = \"upstream.example.invalid/ocp\"\n[[registry.mirror]]\nlocation = \"%s/ocp\"\ninsecure = true\npull-from-mirror = \"digest-only\"\n", host))
	cfg := write(t, dir, "c.toml", fmt.Sprintf("[cri]\npull_secret = \"\"\n[disk]\nregistries_conf = %q\nregistries_conf_dir = %q\ncerts_dir = %q\n",
		regConf, filepath.Join(dir, "none"), filepath.Join(dir, "certs")))

	code, out, errOut := ctl(t, "release", p.Release, "--pool", "worker", "--pool", "master", "--config", cfg)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	res, err := pinset.ParseSetFile("out.yaml", []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	perPool := map[string][]string{}
	for _, s := range res.Sets {
		names = append(names, s.Name)
		if len(s.Images) > 500 {
			t.Fatalf("%s has %d images", s.Name, len(s.Images))
		}
		pool := strings.Split(strings.TrimPrefix(s.Name, "release-4.20.1-"), "-")[0]
		if !s.Selector.Matches(map[string]string{"node-role.kubernetes.io/" + pool: ""}) {
			t.Fatalf("%s does not select pool %s: %s", s.Name, pool, s.Selector)
		}
		perPool[pool] = append(perPool[pool], s.Images...)
	}
	if !slices.Equal(names, []string{"release-4.20.1-worker-1", "release-4.20.1-worker-2", "release-4.20.1-master-1", "release-4.20.1-master-2"}) {
		t.Fatalf("names %v", names)
	}
	if len(perPool["worker"]) != 602 || len(perPool["master"]) != 603 {
		t.Fatalf("worker %d, master %d images", len(perPool["worker"]), len(perPool["master"]))
	}
	if slices.Contains(perPool["worker"], p.Release) || !slices.Contains(perPool["master"], p.Release) {
		t.Fatal("the release image goes to control-plane pools only")
	}
	if slices.Contains(perPool["worker"], p.OS["rhel-coreos-10"]) || !slices.Contains(perPool["worker"], p.OS["rhel-coreos"]) {
		t.Fatal("the default stream's OS images only")
	}
	// Deterministic.
	if _, again, _ := ctl(t, "release", p.Release, "--pool", "worker", "--pool", "master", "--config", cfg); again != out {
		t.Fatal("output differs between runs")
	}
	// Another stream, JSON, a prefix.
	code, out, _ = ctl(t, "release", p.Release, "--pool", "worker", "--os-stream", "rhel-10", "--name", "up", "-o", "json", "--config", cfg)
	if code != 0 || !strings.Contains(out, `"kind": "List"`) || !strings.Contains(out, `"up-worker-2"`) || !strings.Contains(out, p.OS["rhel-coreos-10"]) {
		t.Fatalf("json: %d", code)
	}
	// Clear errors.
	if code, _, errOut := ctl(t, "release", p.Release, "--os-stream", "rhel-8", "--config", cfg); code != 1 || !strings.Contains(errOut, "it has rhel-10, rhel-9") {
		t.Fatalf("unknown stream: %d %s", code, errOut)
	}
	if code, _, errOut := ctl(t, "release", "upstream.example.invalid/ocp/release:4.20.1", "--config", cfg); code != 1 || !strings.Contains(errOut, "is not by digest") {
		t.Fatalf("tag: %d %s", code, errOut)
	}
}
