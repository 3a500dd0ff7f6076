package pinset

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// ErrSetsDirMissing means the sets directory does not exist: a sync fault, not "no sets".
var ErrSetsDirMissing = errors.New("sets directory is missing")

// SetFile is one candidate file of the sets directory as read now.
type SetFile struct {
	Name string // relative to the sets directory
	Data []byte
	Err  error // reading failed (a FIFO, a device, too large, unreadable)
}

// IsSetFileName says whether a directory entry is a set file: *.yaml, *.yml or *.json,
// not hidden. Editors' temp, swap and backup files, ConfigMap's ..data entries and our
// own temp files are hidden or have other extensions.
func IsSetFileName(name string) bool {
	if name == "" || name[0] == '.' {
		return false
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// ClusterSubdir is the part of the sets directory that imagepind's cluster sync manages:
// one file per PinnedImageSet object of the API, <sets_dir>/cluster/<name>.json. Nothing
// else writes there; every other subdirectory is ignored.
const ClusterSubdir = "cluster"

// maxClusterFileName is the longest file name the cluster sync writes: NAME_MAX (255)
// less room for what other names are built from it (the state directory keeps a file's
// last good content as "cluster%2F<file>").
const maxClusterFileName = 230

// ClusterFileName is the file of the API object named name in the cluster
// subdirectory: <name>.json, or for a name too long for that (DNS-1123 allows 253
// characters; NAME_MAX is 255) its first 200 characters, "_" and 16 hex digits of its
// SHA-256. "_" is not allowed in an object name, so no other object's
// file can take that name. The file holds the object, so the set keeps its full name.
func ClusterFileName(name string) string {
	if len(name)+len(".json") <= maxClusterFileName {
		return name + ".json"
	}
	sum := sha256.Sum256([]byte(name))
	return name[:200] + "_" + hex.EncodeToString(sum[:8]) + ".json"
}

// ClusterFile is the object's file relative to the sets directory, as status names it.
func ClusterFile(name string) string { return ClusterSubdir + "/" + ClusterFileName(name) }

// ErrClusterDirMissing means the cluster subdirectory is missing while the cluster sync
// manages it: a sync fault (an rsync --delete, an rm -rf) that keeps the cluster sets, not
// "no cluster sets". The sync re-creates it.
var ErrClusterDirMissing = errors.New("the cluster subdirectory is missing")

// ReadSetsDir reads every set file of dir (not its subdirectories), then those of its
// cluster subdirectory (named "cluster/<file>"), in SortSetFiles order, so that a local
// file wins a name clash with a cluster set. Without the cluster sync (clusterSync
// false) a missing cluster subdirectory holds no sets; with it, ReadSetsDir returns the
// local files and an error wrapping ErrClusterDirMissing, and the caller keeps the
// cluster sets it had.
func ReadSetsDir(dir string, clusterSync bool) ([]SetFile, error) {
	files, err := readSetFiles(dir, "")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", ErrSetsDirMissing, dir)
		}
		return nil, fmt.Errorf("read sets directory: %w", err)
	}
	clusterDir := filepath.Join(dir, ClusterSubdir)
	cluster, cerr := readSetFiles(clusterDir, ClusterSubdir+"/")
	if cerr != nil && !errors.Is(cerr, os.ErrNotExist) {
		return nil, fmt.Errorf("read sets directory: %w", cerr)
	}
	files = append(files, cluster...)
	SortSetFiles(files)
	// A directory being removed (rm -rf) first loses its files: if it is gone now, what
	// we read is not a set of deletions but a sync fault.
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrSetsDirMissing, dir)
	}
	if clusterSync {
		if _, err := os.Stat(clusterDir); errors.Is(err, os.ErrNotExist) || errors.Is(cerr, os.ErrNotExist) {
			return files[:len(files)-len(cluster)], fmt.Errorf("%w: %s", ErrClusterDirMissing, clusterDir)
		}
	}
	return files, nil
}

// IsClusterFile says whether a set file name (relative to the sets directory) is one of
// the cluster sync's.
func IsClusterFile(name string) bool { return strings.HasPrefix(name, ClusterSubdir+"/") }

// SortSetFiles puts set files in the one order every reader uses, live or replaying the
// last good contents after a restart: local files by name, then the cluster sync's by
// name. The first file to define a set name wins a clash (UniqueNames).
func SortSetFiles(files []SetFile) {
	sort.SliceStable(files, func(i, j int) bool { return setFileLess(files[i].Name, files[j].Name) })
}

func setFileLess(a, b string) bool {
	if ca, cb := IsClusterFile(a), IsClusterFile(b); ca != cb {
		return cb
	}
	return a < b
}

func readSetFiles(dir, prefix string) ([]SetFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []SetFile
	for _, e := range entries {
		if !IsSetFileName(e.Name()) || e.IsDir() {
			continue
		}
		data, err := fsutil.ReadRegular(filepath.Join(dir, e.Name()), MaxSetFileSize)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed (or a dangling ConfigMap symlink) since the listing
		}
		files = append(files, SetFile{Name: prefix + e.Name(), Data: data, Err: err})
	}
	return files, nil
}

// FileSets is the sets one file contributes, in file-name order.
type FileSets struct {
	File string
	Sets []Set
}

// UniqueNames drops every file that defines a set name already defined by an earlier
// file (in name order) and returns an error for each dropped file.
func UniqueNames(files []FileSets) ([]FileSets, map[string]error) {
	owner := map[string]string{}
	errs := map[string]error{}
	var kept []FileSets
	for _, f := range files {
		var dup []string
		for _, s := range f.Sets {
			if other, taken := owner[s.Name]; taken {
				dup = append(dup, fmt.Sprintf("set %q is already defined in %s", s.Name, other))
			}
		}
		if len(dup) > 0 {
			errs[f.File] = fmt.Errorf("%s: metadata.name: %s; this file is ignored", f.File, strings.Join(dup, "; "))
			continue
		}
		for _, s := range f.Sets {
			owner[s.Name] = f.File
		}
		kept = append(kept, f)
	}
	return kept, errs
}

// MakeSetsDir makes the sets directory (0755, its missing parents too) if it does not
// exist, as imagepind does once at start: on a node where nothing made it (a
// DaemonSet's fresh host path, an install without the RPM), imagepind would otherwise
// write and read no set. A directory that exists keeps its mode; one that vanishes later
// stays a fault (ErrSetsDirMissing) and is not made again. It says whether it made it.
func MakeSetsDir(dir string) (bool, error) {
	st, err := os.Stat(dir)
	switch {
	case err == nil && st.IsDir():
		return false, nil
	case err == nil:
		return false, fmt.Errorf("sets directory %s: exists and is not a directory (%s)", dir, st.Mode().Type())
	case !errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("sets directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("make the sets directory: %w", err)
	}
	return true, nil
}
