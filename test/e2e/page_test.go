//go:build e2e

package e2e

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/status"
)

// chromium runs headless Chromium with the flags this machine needs (no sandbox as
// root, no background networking on a closed network).
func chromium(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium missing: run hack/e2e-deps.sh")
	}
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--user-data-dir=" + t.TempDir()}
	out, err := exec.Command(bin, append(base, args...)...).Output()
	if err != nil {
		t.Fatalf("chromium %v: %v", args, err)
	}
	return string(out)
}

// The aggregator's status page in a real browser: sets × nodes cells, a failure with
// its message, a screenshot kept in test/artifacts.
func TestStatusPageInChromium(t *testing.T) {
	store := aggregator.NewStore(aggregator.DefaultLimits(), time.Now)
	mk := func(name string, phase status.Phase, ready, total int, reason, msg string, failed ...status.FailedImage) status.Set {
		return status.Set{Name: name, UID: "u", SpecHash: "h", Phase: phase, ImagesReady: ready, ImagesTotal: total, BytesTotal: uint64(total) * 100, BytesReady: uint64(ready) * 100,
			Conditions:   []status.Condition{{Type: status.ConditionReady, Status: "False", Reason: reason, Message: msg}},
			FailedImages: failed}
	}
	reports := map[string][]status.Set{
		"worker-0": {mk("upgrade-4-20", status.Ready, 120, 120, status.ReasonAllImagesPinned, "120 images present and pinned"), mk("apps", status.Ready, 3, 3, status.ReasonAllImagesPinned, "")},
		"worker-1": {mk("upgrade-4-20", status.Failed, 118, 120, status.ReasonImageUnavailable, "2 of 120 images cannot be pulled (see failedImages); the others are present and pinned",
			status.FailedImage{Image: "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + strings.Repeat("ab", 32), Reason: status.ReasonImageUnavailable, Error: "reading manifest: manifest unknown"}),
			mk("apps", status.Ready, 3, 3, status.ReasonAllImagesPinned, "")},
		"worker-2": {mk("upgrade-4-20", status.Pulling, 37, 120, status.ReasonPulling, "37/120 images ready")},
		"master-0": {mk("upgrade-4-20", status.Ready, 121, 121, status.ReasonAllImagesPinned, "")},
	}
	for node, sets := range reports {
		if _, err := store.Ingest(node, v1.FromStatus(status.Node{Node: status.NodeInfo{Name: node}, Sets: sets}, "b", 1, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(aggregator.ReadHandler(store, nil))
	defer srv.Close()

	dom := chromium(t, "--dump-dom", srv.URL+"/")
	for _, want := range []string{
		`<title>imagepin: 1/2 sets ready</title>`,
		`<section class="set" id="set-upgrade-4-20">`,
		`<div class="cell Failed"`, `<div class="node">worker-1</div><div>Failed 118/120</div>`,
		`<div class="cell Pulling"`, `<div class="node">worker-2</div><div>Pulling 37/120</div>`,
		`<div class="node">master-0</div><div>Ready 121/121</div>`,
		`2/4 nodes ready · 1 failed · 1 progressing · 0 unknown`,
		`2 of 120 images cannot be pulled (see failedImages); the others are present and pinned`,
		`reading manifest: manifest unknown`,
		`<meta http-equiv="refresh" content="10">`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(dom, "<script") {
		t.Error("the page must work without JavaScript")
	}
	artifacts, _ := filepath.Abs("../artifacts")
	os.MkdirAll(artifacts, 0o755)
	shot := filepath.Join(artifacts, "status-page.png")
	os.Remove(shot)
	chromium(t, "--window-size=1280,900", "--screenshot="+shot, srv.URL+"/")
	fi, err := os.Stat(shot)
	if err != nil || fi.Size() < 10_000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, fi.Size())
}
