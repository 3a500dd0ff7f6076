package pinset

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// MakeSetsDir makes a missing sets directory with its parents (0755), leaves an existing
// one and its mode alone, and refuses a file in its place, naming it.
func TestMakeSetsDir(t *testing.T) {
	dir := t.TempDir()
	sets := filepath.Join(dir, "state", "sets.d")
	made, err := MakeSetsDir(sets)
	if err != nil || !made {
		t.Fatalf("fresh: made %v, %v", made, err)
	}
	if st, err := os.Stat(sets); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("fresh: %v %v, want a 0755 directory", st, err)
	}
	if _, err := ReadSetsDir(sets, false); err != nil {
		t.Fatalf("made directory unreadable as the sets directory: %v", err)
	}
	os.Chmod(sets, 0o750)
	if made, err := MakeSetsDir(sets); err != nil || made {
		t.Fatalf("existing: made %v, %v", made, err)
	}
	if st, _ := os.Stat(sets); st.Mode().Perm() != 0o750 {
		t.Errorf("existing directory's mode changed to %s", st.Mode())
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	if _, err := MakeSetsDir(file); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("a file in its place: %v, want an error naming %s", err, file)
	}
	if b, _ := os.ReadFile(file); string(b) != "x" {
		t.Errorf("the file in its place was changed")
	}
}
