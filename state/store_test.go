package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/pinset"
)

func TestStoreRoundTrip(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.Load()
	if err != nil || d.Pins != nil {
		t.Fatalf("fresh: %+v %v", d, err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d = Data{Pins: map[string]time.Time{"a": at}, Labels: map[string]string{"x": "y"}, Completed: map[string]Completed{"s": {UID: "u", SpecHash: "h", At: at}}}
	if err := s.Save(d); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load()
	if err != nil || !got.Pins["a"].Equal(at) || got.Labels["x"] != "y" || got.Completed["s"].SpecHash != "h" {
		t.Fatalf("%+v %v", got, err)
	}
	if err := s.SaveGood("a.yaml", []byte("content")); err != nil {
		t.Fatal(err)
	}
	if b, ok := s.Good("a.yaml"); !ok || string(b) != "content" {
		t.Fatal("good content lost")
	}
	if names := s.GoodNames(); len(names) != 1 || names[0] != "a.yaml" {
		t.Fatalf("names %v", names)
	}
	if err := s.SaveGood("../escape", nil); err == nil {
		t.Fatal("path escape accepted")
	}
	if err := s.Forget("a.yaml"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Good("a.yaml"); ok {
		t.Fatal("forgotten file still there")
	}
}

func TestCorruptStateIsEmptyAndReported(t *testing.T) {
	dir := t.TempDir()
	s, _ := Open(dir)
	os.WriteFile(filepath.Join(dir, "state.json"), []byte("{half"), 0o600)
	d, err := s.Load()
	if err == nil || d.Pins != nil {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestLockIsExclusive(t *testing.T) {
	s, _ := Open(t.TempDir())
	unlock, err := s.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lock(); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v", err)
	}
	unlock()
	unlock2, err := s.Lock()
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
}

// The last good content of a cluster set with the longest name an object can have is kept:
// its stored name ("cluster%2F<file>") fits NAME_MAX.
func TestLongClusterFileNameIsStored(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	name := pinset.ClusterFile(strings.Repeat("a", 253))
	if err := s.SaveGood(name, []byte("content")); err != nil {
		t.Fatal(err)
	}
	if b, ok := s.Good(name); !ok || string(b) != "content" {
		t.Fatal("good content lost")
	}
	if names := s.GoodNames(); len(names) != 1 || names[0] != name {
		t.Fatalf("names %v", names)
	}
}
