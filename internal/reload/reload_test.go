package reload

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An unchanged file is not loaded again, a changed one is; a change that does not load
// keeps the last good value and is not loaded again until the file changes once more.
func TestLoadsOnlyWhenTheFileChanges(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	loads := 0
	f := New(func() (string, error) {
		loads++
		b, err := os.ReadFile(file)
		if err != nil || string(b) == "broken" {
			return "", errors.New("does not load")
		}
		return string(b), nil
	}, file)
	if _, err := f.Get(); err == nil {
		t.Fatal("a missing file with nothing loaded before gave no error")
	}
	at := time.Now()
	write := func(s string) {
		t.Helper()
		at = at.Add(time.Second)
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(file, at, at)
	}
	get := func(want string, wantLoads int) {
		t.Helper()
		v, err := f.Get()
		if err != nil || v != want || loads != wantLoads {
			t.Fatalf("got %q, %v after %d loads; want %q after %d", v, err, loads, want, wantLoads)
		}
	}
	write("one")
	get("one", 2)
	get("one", 2)
	write("two")
	get("two", 3)
	write("broken")
	get("two", 4)
	get("two", 4)
	write("three")
	get("three", 5)
}
