package seed

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// MediaFaults are the media of the watched seed directory ([seed] directory) that are
// not seeded for a fault of theirs, as the directory's watcher last found them: a
// medium refused (a truncated tar, a bad blob), one that cannot be read (its seed is
// kept), one whose seed failed. The watcher writes them (<Dir>/directory-faults.state)
// whenever they change; imagepinctl seed --list and the node's status show them, naming
// each file, until it is taken away or seeded.
type MediaFaults struct {
	// Directory is the directory watched: faults of another (the config changed since)
	// are not shown.
	Directory string       `json:"directory"`
	Updated   time.Time    `json:"updated"`
	Media     []MediaFault `json:"media"`
}

// MediaFault is one medium's fault.
type MediaFault struct {
	Path  string `json:"path"`
	Fault string `json:"fault"`
}

// String is the fault as the node's status shows it.
func (f MediaFault) String() string { return "seed directory: " + f.Path + ": " + f.Fault }

// mediaFaultsFile holds MediaFaults in a records' directory; not a record (those end
// in .json).
const mediaFaultsFile = "directory-faults.state"

// maxMediaFaults bounds the file read back.
const maxMediaFaults = 4 << 20

// WriteMediaFaults writes f into the records' directory dir, atomically.
func WriteMediaFaults(dir string, f MediaFaults) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("seed directory faults: %w", err)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteAtomic(filepath.Join(dir, mediaFaultsFile), "", append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("seed directory faults: %w", err)
	}
	return nil
}

// ReadMediaFaults reads what WriteMediaFaults wrote in dir; nil when nothing was.
func ReadMediaFaults(dir string) (*MediaFaults, error) {
	file := filepath.Join(dir, mediaFaultsFile)
	b, err := fsutil.ReadRegular(file, maxMediaFaults)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("seed directory faults %s: %w", file, err)
	}
	var f MediaFaults
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("seed directory faults %s: %w", file, err)
	}
	return &f, nil
}
