package peers

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
)

// offFiles is a runtime's files naming the mirror: rendered for no pins, they name it
// no more (or fail to be rewritten).
type offFiles struct {
	renders [][]string
	err     error
}

func (f *offFiles) Render(patterns []string) (bool, error) {
	f.renders = append(f.renders, patterns)
	return f.err == nil, f.err
}

// [peers] off: every runtime's files are rendered for no pins, even when one fails; the
// tag endpoint's CA is untrusted; a store imagepind made is removed, only what it holds.
func TestOffTakesTheMirrorOutOfEverything(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if _, err := blobstore.Open(dir); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "db"), []byte("y"), 0o600)
	failing, crio := &offFiles{err: errors.New("read-only")}, &offFiles{}
	untrusted := 0
	Off(Leftovers{Store: dir, Files: []Files{failing, crio}, Untrust: func() error { untrusted++; return nil }}, logrus.New())
	for _, f := range []*offFiles{failing, crio} {
		if len(f.renders) != 1 || f.renders[0] != nil {
			t.Fatalf("renders %q, want one for no pins", f.renders)
		}
	}
	if untrusted != 1 {
		t.Fatalf("the tag endpoint's CA untrusted %d times, want once", untrusted)
	}
	if _, err := os.Stat(filepath.Join(dir, ".imagepin-blobstore")); !os.IsNotExist(err) {
		t.Errorf("the store's marker stays with [peers] off: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "db")); err != nil {
		t.Errorf("db deleted with the store: %v", err)
	}
	Off(Leftovers{Store: filepath.Join(t.TempDir(), "never")}, logrus.New()) // nothing there: nothing to do
}

// [peers] off with store_dir naming a directory imagepind never made a store of (the
// state directory, a data mount): every file in it stays. Before, imagepind ran
// os.RemoveAll(store_dir) at every start with [peers] off.
func TestOffLeavesAStoreDirItDidNotMake(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	os.MkdirAll(filepath.Join(data, "blobs"), 0o755)
	os.WriteFile(filepath.Join(data, "blobs", "mine"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(data, "db"), []byte("y"), 0o600)
	Off(Leftovers{Store: data}, logrus.New())
	for _, f := range []string{"blobs/mine", "db"} {
		if _, err := os.Stat(filepath.Join(data, f)); err != nil {
			t.Errorf("%s deleted with [peers] off: %v", f, err)
		}
	}
}
