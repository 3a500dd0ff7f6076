//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/imagepin/imagepin/status"
)

// Hostile files dropped next to a Ready set: imagepind neither crashes nor hangs,
// unpins nothing, writes no broken CRI-O config, and reports each file by name.
func TestHostileInput(t *testing.T) { hostileInput(t, newWorld(t)) }

// hostileInput is the hostile-input scenario on any runtime: the pins compared are
// CRI-O's live pinned_images, or on containerd every pinned image record.
func hostileInput(t *testing.T, w *world) {
	refs := w.push("safe", 2)
	w.startDaemon()
	w.writeSet("safe.yaml", alphaSet("safe", refs...))
	w.waitFor("safe Ready", 60*time.Second, phaseIs("safe", status.Ready))
	before := w.pins()

	var bomb strings.Builder
	bomb.WriteString("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		bomb.WriteString(n + ": &" + n + " [" + strings.TrimSuffix(strings.Repeat("*"+prev+",", 9), ",") + "]\n")
		prev = n
	}
	full := alphaSet("safe-copy", refs...)
	files := map[string]string{
		"alias-bomb.yaml":   bomb.String(),
		"huge.yaml":         "# " + strings.Repeat("x", 11<<20),
		"deep.json":         strings.Repeat("[", 200000) + strings.Repeat("]", 200000),
		"invalid-utf8.yaml": "apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: \"a\xff\xfe\"}\n",
		"dotdot.yaml":       alphaSet("../../etc/passwd", refs[0]),
		"inject.yaml":       strings.Replace(alphaSet("inject", refs[0]), refs[0], "\""+refs[0]+"\\\"]\\n[crio.runtime]\\ndefault_runtime = \\\"evil\\\"\\n#\"", 1),
		"star.yaml":         strings.Replace(alphaSet("star", refs[0]), refs[0], "\"*\"", 1),
		"empty.yaml":        "",
		"truncated.yaml":    full[:len(full)/2+7],
		"zz-dup.yaml":       alphaSet("safe", refs[0]),
	}
	for name, content := range files {
		os.WriteFile(filepath.Join(w.setsDir, name), []byte(content), 0o644)
	}
	if err := syscall.Mkfifo(filepath.Join(w.setsDir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(w.setsDir, "zero.yaml")); err != nil {
		t.Fatal(err)
	}
	want := []string{"alias-bomb.yaml", "huge.yaml", "deep.json", "invalid-utf8.yaml", "dotdot.yaml", "inject.yaml", "star.yaml",
		"empty.yaml", "truncated.yaml", "zz-dup.yaml", "fifo.yaml", "zero.yaml"}
	n := w.waitFor("every hostile file reported", 30*time.Second, func(n status.Node) bool { return len(n.FileErrors) == len(want) })
	for _, fe := range n.FileErrors {
		if !slices.Contains(want, fe.File) || !strings.HasPrefix(fe.Error, fe.File+": ") {
			t.Errorf("file error does not name its file: %+v", fe)
		}
		if len(fe.Error) > 8<<10 {
			t.Errorf("%s: a %d-byte error", fe.File, len(fe.Error))
		}
	}
	for _, fe := range n.FileErrors {
		t.Logf("%s", fe.Error[:min(len(fe.Error), 200)])
	}
	if s := n.Set("safe"); s == nil || s.Phase != status.Ready || s.File != "safe.yaml" {
		t.Fatalf("the safe set changed: %+v", s)
	}
	time.Sleep(3 * time.Second) // past unpin_delay
	if after := w.pins(); !slices.Equal(before, after) {
		t.Fatalf("pins changed: %v → %v", before, after)
	}
	w.requirePinned(refs...)
	if w.crio != nil && w.ctr == nil {
		w.requireConfigParses()
	}
	select {
	case <-w.daemonCh:
		t.Fatal("imagepind died")
	default:
	}
	// Still responsive: a new good set goes through.
	more := w.push("after", 1)
	w.writeSet("after.yaml", alphaSet("after", more...))
	w.waitFor("after Ready", 60*time.Second, phaseIs("after", status.Ready))
}
