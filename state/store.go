package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// Data is the small JSON document of the state directory.
type Data struct {
	// Pins maps each pattern imagepind pinned to the last time a set wanted it.
	Pins map[string]time.Time `json:"pins,omitempty"`
	// Unchecked are the pins written while the disk check had not judged any set
	// wanting the image: a verdict refusing it takes them away at once.
	Unchecked map[string]bool `json:"unchecked,omitempty"`
	// PulledEarly are unchecked images pulled before the check's verdict (the check
	// proved they fit whatever it says): the node holds them, yet a verdict refusing
	// their set takes their pins away at once, as for images it does not hold.
	PulledEarly map[string]bool `json:"pulledEarly,omitempty"`
	// Labels are the last good contents of the labels file.
	Labels map[string]string `json:"labels,omitempty"`
	// Completed maps a set name to the uid and spec hash it was last Ready with.
	Completed map[string]Completed `json:"completed,omitempty"`
	// Sizes are the compressed bytes of images the disk check sized: present images
	// are not asked about again, but their size stays in status.
	Sizes map[string]uint64 `json:"sizes,omitempty"`
}

// Completed records that a set version was Ready on this node.
type Completed struct {
	UID      string    `json:"uid"`
	SpecHash string    `json:"specHash"`
	At       time.Time `json:"at"`
}

// Store is the state directory.
type Store struct {
	dir string
}

const (
	dataFile  = "state.json"
	filesDir  = "files"
	lockFile  = LockFile
	maxStored = 8 << 20
)

// LockFile is the lock's name in the state directory: held by imagepind, imagepinctl
// apply and imagepind uninstall, one at a time.
const LockFile = "lock"

// Open creates the state directory if needed.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, filesDir), 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// Load reads the state; a missing or unreadable document is an empty state (and an
// error to report), never a reason to stop.
func (s *Store) Load() (Data, error) {
	var d Data
	b, err := fsutil.ReadRegular(filepath.Join(s.dir, dataFile), maxStored)
	if errors.Is(err, os.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("read state: %w", err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return Data{}, fmt.Errorf("state %s is corrupt, starting afresh: %w", filepath.Join(s.dir, dataFile), err)
	}
	return d, nil
}

// Save writes the state atomically.
func (s *Store) Save(d Data) error {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteAtomic(filepath.Join(s.dir, dataFile), "", b, 0o600)
}

// keyEscaper turns a set file's name relative to the sets directory (a base name, or
// "cluster/<name>" for the cluster sync's files) into one flat stored name.
var (
	keyEscaper   = strings.NewReplacer("%", "%25", "/", "%2F")
	keyUnescaper = strings.NewReplacer("%2F", "/", "%25", "%")
)

// fileKey maps a set file name to its stored name.
func fileKey(name string) (string, error) {
	if name == "" || name == "." || name == ".." || strings.HasPrefix(name, "/") || strings.Contains(name, "..") || strings.Count(name, "/") > 1 {
		return "", fmt.Errorf("bad set file name %q", name)
	}
	return keyEscaper.Replace(name), nil
}

// SaveGood records a file's content as its last good one (written only on change).
func (s *Store) SaveGood(name string, data []byte) error {
	key, err := fileKey(name)
	if err != nil {
		return err
	}
	p := filepath.Join(s.dir, filesDir, key)
	if old, err := fsutil.ReadRegular(p, maxStored); err == nil && string(old) == string(data) {
		return nil
	}
	return fsutil.WriteAtomic(p, "", data, 0o600)
}

// Good returns a file's last good content.
func (s *Store) Good(name string) ([]byte, bool) {
	key, err := fileKey(name)
	if err != nil {
		return nil, false
	}
	b, err := fsutil.ReadRegular(filepath.Join(s.dir, filesDir, key), maxStored)
	return b, err == nil
}

// GoodNames lists the files with a last good content, sorted.
func (s *Store) GoodNames() []string {
	ents, _ := os.ReadDir(filepath.Join(s.dir, filesDir))
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, keyUnescaper.Replace(e.Name()))
		}
	}
	sort.Strings(names)
	return names
}

// Forget drops a deleted file's last good content.
func (s *Store) Forget(name string) error {
	key, err := fileKey(name)
	if err != nil {
		return err
	}
	return fsutil.RemoveDurable(filepath.Join(s.dir, filesDir, key))
}

// ErrLocked means another imagepind or imagepinctl apply holds the state directory.
var ErrLocked = errors.New("state directory is locked by another imagepind or imagepinctl apply")

// Running says whether a process (imagepind, or imagepinctl apply) holds dir's lock. It
// creates nothing: a directory or lock file that does not exist is "not running".
func Running(dir string) (bool, error) {
	f, err := os.Open(filepath.Join(dir, lockFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return true, nil
		}
		return false, err
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false, nil
}

// Lock takes the state directory's exclusive lock; it is released by the returned func
// or when the process dies (flock), so a kill -9 never leaves it stale.
func (s *Store) Lock() (func(), error) {
	unlock, err := fsutil.TryLock(filepath.Join(s.dir, lockFile))
	switch {
	case errors.Is(err, fsutil.ErrLocked):
		return nil, ErrLocked
	case err != nil:
		return nil, fmt.Errorf("lock: %w", err)
	}
	return unlock, nil
}
