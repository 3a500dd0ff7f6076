package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	n := status.Node{Node: status.NodeInfo{Name: "w3", Architecture: "amd64", Runtime: status.Runtime{Name: "cri-o", Version: "1.34.0"}},
		Sets: []status.Set{
			{Name: "ok", Phase: status.Ready, ImagesReady: 2, ImagesTotal: 2, Conditions: []status.Condition{{Type: status.ConditionReady, Status: status.True, Reason: status.ReasonAllImagesPinned, Message: "2 images present and pinned"}}},
			{Name: "bad", Phase: status.Failed, ImagesReady: 1, ImagesTotal: 2, FailedImages: []status.FailedImage{{Image: "quay.io/x@" + digest, Reason: status.ReasonImageUnavailable, Error: "manifest unknown"}}},
		},
		FileErrors: []status.FileError{{File: "x.yaml", Error: "x.yaml: document 1: kind: missing"}}}
	if err := status.WriteFile(statusFile, n); err != nil {
		t.Fatal(err)
	}
	code, out, _ := ctl(t, "status", "--config", cfg)
	for _, want := range []string{"node w3 (amd64), cri-o 1.34.0", "ok   Ready   2/2", "bad  Failed  1/2", "bad: ImageUnavailable quay.io/x@" + digest + ": manifest unknown", "file error: x.yaml: document 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Fatalf("a set not Ready: code %d", code)
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
