package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/status"
)

const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

func ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := write(t, dir, "a.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [\"quay.io/x/a@"+digest+"\"]}\n")
	code, out, errOut := ctl(t, "validate", good)
	if code != 0 || out != "" || !strings.Contains(errOut, `set "a": 1 images, applies to every node`) {
		t.Fatalf("code %d out %q err %q", code, out, errOut)
	}
	bad := write(t, dir, "b.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: b}\nspec: {pinnedImages: [\"quay.io/x/a:latest\"]}\n")
	dup := write(t, dir, "c.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [\"quay.io/x/c@"+digest+"\"]}\n")
	code, out, _ = ctl(t, "validate", dup, bad, good)
	if code != 1 {
		t.Fatalf("code %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], bad+": document 1") || !strings.HasPrefix(lines[1], dup+": metadata.name: set \"a\" is already defined in "+good) {
		t.Fatalf("output:\n%s", out)
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() { c, _, _ := ctl(t, "validate", fifo); done <- c }()
	select {
	case c := <-done:
		if c != 1 {
			t.Fatalf("FIFO: code %d", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("validate hung on a FIFO")
	}
	if code, _, _ := ctl(t, "validate"); code != 2 {
		t.Fatalf("no args: code %d", code)
	}
}

func TestStatus(t *testing.T) {
	dir := t.TempDir()
	statusFile := filepath.Join(dir, "status.json")
	cfg := write(t, dir, "c.toml", "status_file = \""+statusFile+"\"\n")
	if code, _, errOut := ctl(t, "status", "--config", cfg); code != 2 || !strings.Contains(errOut, "is imagepind running?") {
		t.Fatalf("no status file: %d %q", code, errOut)
	}
	n := status.Node{Node: status.NodeInfo{Name: "w3", Architecture: "amd64", Runtime: status.Runtime{Name: "cri-o", Version: "1.34.0"},
		Peers:  &status.PeerBytes{FromRegistry: 3 << 30, FromPeers: 12 << 30, ToPeers: 1 << 30, Stored: 3 << 30},
		Seeded: &status.Seeded{Seeds: 2, Images: 40, Bytes: 1 << 30}},
		Sets: []status.Set{
			{Name: "ok", Phase: status.Ready, ImagesReady: 2, ImagesTotal: 2, BytesFromRegistry: 5 << 20, Conditions: []status.Condition{{Type: status.ConditionReady, Status: status.True, Reason: status.ReasonAllImagesPinned, Message: "2 images present and pinned"}}},
			{Name: "bad", Phase: status.Failed, ImagesReady: 1, ImagesTotal: 2, FailedImages: []status.FailedImage{{Image: "quay.io/x@" + digest, Reason: status.ReasonImageUnavailable, Error: "manifest unknown"}}},
		},
		FileErrors: []status.FileError{{File: "x.yaml", Error: "x.yaml: document 1: kind: missing"}}}
	if err := status.WriteFile(statusFile, n); err != nil {
		t.Fatal(err)
	}
	code, out, _ := ctl(t, "status", "--config", cfg)
	for _, want := range []string{"node w3 (amd64), cri-o 1.34.0", "blobs: 3.0 GiB from registries, 12.0 GiB from peers, 1.0 GiB served to peers; 3.0 GiB stored", "seeded: 2 seeds, 40 images, 1.0 GiB in the store until removed", "ok: 5.0 MiB fetched from registries by this node", "ok   Ready   2/2", "bad  Failed  1/2", "bad: ImageUnavailable quay.io/x@" + digest + ": manifest unknown", "file error: x.yaml: document 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Fatalf("a set not Ready: code %d", code)
	}
	// One seed of one image: in the singular.
	n.Node.Seeded = &status.Seeded{Seeds: 1, Images: 1, Bytes: 1 << 20}
	if err := status.WriteFile(statusFile, n); err != nil {
		t.Fatal(err)
	}
	if _, out, _ = ctl(t, "status", "--config", cfg); !strings.Contains(out, "seeded: 1 seed, 1 image, 1.0 MiB in the store") {
		t.Errorf("one seed of one image:\n%s", out)
	}
	code, out, _ = ctl(t, "status", "--config", cfg, "-o", "json")
	if code != 1 || !strings.Contains(out, `"phase": "Failed"`) {
		t.Fatalf("json: %d\n%s", code, out)
	}
}

func TestApplyRefusesWhileLocked(t *testing.T) {
	dir := t.TempDir()
	cfg := write(t, dir, "c.toml", "state_dir = \""+filepath.Join(dir, "state")+"\"\n")
	set := write(t, dir, "a.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [\"quay.io/x/a@"+digest+"\"]}\n")
	unlock := lockState(t, filepath.Join(dir, "state"))
	defer unlock()
	code, _, errOut := ctl(t, "apply", "--config", cfg, set)
	if code != 2 || !strings.Contains(errOut, "locked by another imagepind") {
		t.Fatalf("%d %q", code, errOut)
	}
}

// Every command has help with examples, --flag spelling, and the usage errors exit 2.
func TestHelpCompletionAndUsageErrors(t *testing.T) {
	for _, cmd := range []string{"validate", "resolve", "release", "status", "check", "apply"} {
		code, out, _ := ctl(t, cmd, "--help")
		if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "imagepinctl "+cmd) ||
			!strings.Contains(out, "--config string") || strings.Contains(out, "Usage of") {
			t.Errorf("%s --help: exit %d\n%s", cmd, code, out)
		}
	}
	if code, out, _ := ctl(t, "--help"); code != 0 || !strings.Contains(out, "Set files:") || !strings.Contains(out, "completion") {
		t.Errorf("--help: %d\n%s", code, out)
	}
	for _, args := range [][]string{{}, {"bogus"}, {"status", "--bogus"}, {"status", "-o", "xml"}, {"validate"}, {"release"},
		{"status", "--watch"}, {"apply", "--reload", "sometimes", "x.yaml"}} {
		if code, _, errOut := ctl(t, args...); code != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
	}
	if code, out, _ := ctl(t, "version"); code != 0 || strings.TrimSpace(out) != version {
		t.Errorf("version: %d %q", code, out)
	}
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if code, out, _ := ctl(t, "completion", shell); code != 0 || !strings.Contains(out, "imagepinctl") {
			t.Errorf("completion %s: %d", shell, code)
		}
	}
	// Completion offers the output formats and set files.
	code, out, _ := ctl(t, "__complete", "status", "-o", "")
	if code != 0 || !strings.Contains(out, "table\nwide\njson\nyaml\n") {
		t.Errorf("complete -o: %d\n%s", code, out)
	}
	if code, out, _ := ctl(t, "__complete", "validate", ""); code != 0 || !strings.Contains(out, "yaml\nyml\njson\n:8") {
		t.Errorf("complete files: %d\n%s", code, out)
	}
}

// Flags may follow file arguments (they used to be read as files).
func TestFlagsAfterFiles(t *testing.T) {
	dir := t.TempDir()
	good := write(t, dir, "a.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [\"quay.io/x/a@"+digest+"\"]}\n")
	// Read as files, "--config" and "/dev/null" would each be an error line.
	if code, out, errOut := ctl(t, "validate", good, "--config", "/dev/null"); code != 0 || out != "" {
		t.Fatalf("validate FILE --config: %d %q %s", code, out, errOut)
	}
}

func TestStatusOutputFormats(t *testing.T) {
	dir := t.TempDir()
	statusFile := filepath.Join(dir, "status.json")
	stateDir := filepath.Join(dir, "state")
	cfg := write(t, dir, "c.toml", "status_file = \""+statusFile+"\"\nstate_dir = \""+stateDir+"\"\n")
	n := status.Node{Node: status.NodeInfo{Name: "w3", Architecture: "amd64"},
		Sets: []status.Set{{Name: "ok", UID: "u-1", File: "ok.yaml", Phase: status.Ready, ImagesReady: 2, ImagesTotal: 2, BytesReady: 3 << 20, BytesTotal: 3 << 20}}}
	if err := status.WriteFile(statusFile, n); err != nil {
		t.Fatal(err)
	}
	// imagepind not running: the status is flagged stale, and that needs attention.
	code, _, errOut := ctl(t, "status", "--config", cfg)
	if code != 1 || !strings.Contains(errOut, "STALE: imagepind is not running") {
		t.Fatalf("stale: %d %s", code, errOut)
	}
	unlock := lockState(t, stateDir) // imagepind runs
	defer unlock()
	code, out, _ := ctl(t, "status", "--config", cfg, "-o", "wide")
	if code != 0 || !strings.Contains(out, "BYTES") || !strings.Contains(out, "3.0 MiB/3.0 MiB") || !strings.Contains(out, "ok.yaml") || !strings.Contains(out, "u-1") {
		t.Fatalf("wide: %d\n%s", code, out)
	}
	code, out, _ = ctl(t, "status", "--config", cfg, "--output", "yaml")
	var back status.Node
	if err := yaml.Unmarshal([]byte(out), &back); code != 0 || err != nil || back.Sets[0].Name != "ok" || back.Node.Name != "w3" {
		t.Fatalf("yaml: %d %v\n%s", code, err, out)
	}
}

// File errors and faults need attention even when every set is Ready.
func TestStatusExitsNonZeroOnFileErrorsAndFaults(t *testing.T) {
	dir := t.TempDir()
	statusFile := filepath.Join(dir, "status.json")
	stateDir := filepath.Join(dir, "state")
	cfg := write(t, dir, "c.toml", "status_file = \""+statusFile+"\"\nstate_dir = \""+stateDir+"\"\n")
	unlock := lockState(t, stateDir)
	defer unlock()
	ready := []status.Set{{Name: "ok", Phase: status.Ready, ImagesReady: 1, ImagesTotal: 1}}
	for _, c := range []struct {
		n    status.Node
		code int
	}{
		{status.Node{Sets: ready}, 0},
		{status.Node{Sets: ready, FileErrors: []status.FileError{{File: "x.yaml", Error: "x.yaml: document 1: kind: missing"}}}, 1},
		{status.Node{Sets: ready, Faults: []string{"container runtime unavailable"}}, 1},
	} {
		if err := status.WriteFile(statusFile, c.n); err != nil {
			t.Fatal(err)
		}
		if code, out, errOut := ctl(t, "status", "--config", cfg); code != c.code {
			t.Errorf("%+v: exit %d, want %d\n%s%s", c.n, code, c.code, out, errOut)
		}
	}
}

// apply keeps its own state: imagepind's state directory (last good files, pin times)
// and status file are left as they were.
func TestApplyLeavesTheDaemonsStateAlone(t *testing.T) {
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	statusFile := filepath.Join(dir, "status.json")
	daemonState := `{"pins": {"quay.io/x/daemon@` + digest + `": "0001-01-01T00:00:00Z"}}`
	os.MkdirAll(filepath.Join(stateDir, "files"), 0o700)
	write(t, stateDir, "state.json", daemonState)
	write(t, filepath.Join(stateDir, "files"), "daemon.yaml", "kept")
	if err := status.WriteFile(statusFile, status.Node{Node: status.NodeInfo{Name: "daemon"}}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(statusFile)
	cfg := write(t, dir, "c.toml", fmt.Sprintf("state_dir = %q\nstatus_file = %q\n[cri]\nendpoint = \"unix://%s\"\n[crio]\nconfig = %q\nconfig_dir = %q\nreload = \"signal\"\n",
		stateDir, statusFile, filepath.Join(dir, "no.sock"), filepath.Join(dir, "crio.conf"), filepath.Join(dir, "crio.conf.d")))
	set := write(t, dir, "a.yaml", "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: a}\nspec: {pinnedImages: [\"quay.io/x/a@"+digest+"\"]}\n")
	if code, _, errOut := ctl(t, "apply", "--config", cfg, "--timeout", "1s", set); code != 1 || !strings.Contains(errOut, "gave up") {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	if after, _ := os.ReadFile(statusFile); string(after) != string(before) {
		t.Fatalf("apply wrote imagepind's status file:\n%s", after)
	}
	if data, _ := os.ReadFile(filepath.Join(stateDir, "state.json")); string(data) != daemonState {
		t.Fatalf("apply changed imagepind's state:\n%s", data)
	}
	ents, _ := os.ReadDir(filepath.Join(stateDir, "files"))
	if len(ents) != 1 || ents[0].Name() != "daemon.yaml" {
		t.Fatalf("apply changed imagepind's last good files: %v", ents)
	}
}

// apply with no set for this node did nothing: that is not a success.
func TestApplyWithNoSetForThisNode(t *testing.T) {
	dir := t.TempDir()
	cfg := write(t, dir, "c.toml", fmt.Sprintf("state_dir = %q\n[node]\nname = \"w1\"\nlabels = {\"node-role.kubernetes.io/worker\" = \"\"}\nlabels_file = \"\"\n[cri]\nendpoint = \"unix://%s\"\n[crio]\nconfig = %q\nconfig_dir = %q\nreload = \"signal\"\n",
		filepath.Join(dir, "state"), filepath.Join(dir, "no.sock"), filepath.Join(dir, "crio.conf"), filepath.Join(dir, "crio.conf.d")))
	set := write(t, dir, "m.yaml", "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata: {name: m, labels: {machineconfiguration.openshift.io/role: master}}\nspec: {pinnedImages: [{name: \"quay.io/x/a@"+digest+"\"}]}\n")
	code, _, errOut := ctl(t, "apply", "--config", cfg, "--timeout", "10s", set)
	if code != 1 || !strings.Contains(errOut, "no set in "+set+" selects node w1: nothing was done") {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
}

// A set that targets no node is valid (exit 0), but validate warns, and says it in the
// set's line and the summary; imagepinctl status lists it under the node's sets.
func TestASetTargetingNoNodeIsShown(t *testing.T) {
	dir := t.TempDir()
	set := write(t, dir, "nowhere.yaml", "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: nowhere}\nspec: {pinnedImages: [\"quay.io/x/a@"+digest+"\"]}\n")
	code, out, errOut := ctl(t, "validate", set)
	for _, want := range []string{"warning: " + set + `: document 1 (set "nowhere"): spec.nodeSelector: missing`,
		`set "nowhere": 1 images, applies to NO node (no spec.nodeSelector and no machineconfiguration.openshift.io/role label)`,
		"1 files valid, 1 sets, 1 targeting no node"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("validate: missing %q in:\n%s", want, errOut)
		}
	}
	if code != 0 || out != "" {
		t.Fatalf("validate: code %d, out %q", code, out)
	}

	statusFile := filepath.Join(dir, "status.json")
	stateDir := filepath.Join(dir, "state")
	cfg := write(t, dir, "c.toml", "status_file = \""+statusFile+"\"\nstate_dir = \""+stateDir+"\"\n")
	unlock := lockState(t, stateDir)
	defer unlock()
	n := status.Node{Sets: []status.Set{}, Untargeted: []status.Untargeted{{Name: "nowhere", File: "nowhere.yaml", Why: "no spec.nodeSelector and no machineconfiguration.openshift.io/role label"}}}
	if err := status.WriteFile(statusFile, n); err != nil {
		t.Fatal(err)
	}
	code, out, _ = ctl(t, "status", "--config", cfg)
	if want := "set nowhere (nowhere.yaml): targets no node: no spec.nodeSelector and no machineconfiguration.openshift.io/role label"; !strings.Contains(out, want) {
		t.Errorf("status: missing %q in:\n%s", want, out)
	}
	if code != 0 {
		t.Fatalf("status: code %d; a set targeting no node is shown, not a failure", code)
	}
}
