package endpoint

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// Originals records what a path held before imagepind first changes it
// (original.Book.Keep); an error leaves the path as it is.
type Originals interface {
	Keep(path string) error
}

// Trust makes CRI-O (containers/image) trust caPEM for exactly hostPort: the file
// <certsDir>/<hostPort>/ca.crt, written only when it differs. changed says it was.
// originals, when not nil, records what the path held before the first write.
func Trust(certsDir, hostPort string, caPEM []byte, originals Originals) (changed bool, err error) {
	dir := filepath.Join(certsDir, hostPort)
	path := filepath.Join(dir, "ca.crt")
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, caPEM) {
		return false, nil
	}
	if originals != nil {
		if err := originals.Keep(path); err != nil {
			return false, fmt.Errorf("trust the tag mirror's CA: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("trust the tag mirror's CA: %w", err)
	}
	// The temp file beside the directory: containers/image reads every *.crt in it.
	if err := fsutil.WriteAtomic(path, certsDir, caPEM, 0o644); err != nil {
		return false, fmt.Errorf("trust the tag mirror's CA: %w", err)
	}
	return true, nil
}

// Untrust removes what Trust wrote for hostPort when it still holds caPEM.
func Untrust(certsDir, hostPort string, caPEM []byte) error {
	dir := filepath.Join(certsDir, hostPort)
	path := filepath.Join(dir, "ca.crt")
	old, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(old, caPEM) {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return err
	}
	_ = os.Remove(dir) // only when empty
	return nil
}

// Forget removes the trust Trust gave the CA kept in stateDir for hostPort, when there is
// such a CA (the tag endpoint turned off).
func Forget(stateDir, certsDir, hostPort string) error {
	caPEM, err := os.ReadFile(filepath.Join(stateDir, CACertFile))
	if err != nil {
		return nil
	}
	return Untrust(certsDir, hostPort, caPEM)
}
