package seedwatch

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// fingerprint is what says a medium changed: its files, their bytes and the latest
// modification time among them and its directories.
type fingerprint struct {
	files int
	bytes int64
	mtime time.Time
	dir   bool
}

// empty: nothing to seed (an empty directory: a mount point with nothing mounted).
func (f fingerprint) empty() bool { return f.dir && f.files == 0 }

// errGone is fingerprintOf's error for a medium whose own entry is no longer there.
var errGone = errors.New("gone")

// fingerprintOf reads path's fingerprint, following no link. A medium whose own entry
// is not there is errGone; any other error (one of an entry under it included, such as
// a file removed while the medium is walked) says it cannot be read now.
func fingerprintOf(path string) (fingerprint, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fingerprint{}, fmt.Errorf("%s: %w", path, errGone)
	}
	if err != nil {
		return fingerprint{}, err
	}
	if !fi.IsDir() {
		return fingerprint{files: 1, bytes: fi.Size(), mtime: fi.ModTime()}, nil
	}
	fp := fingerprint{dir: true}
	err = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.ModTime().After(fp.mtime) {
			fp.mtime = info.ModTime()
		}
		if !d.IsDir() {
			fp.files++
			fp.bytes += info.Size()
		}
		return nil
	})
	return fp, err
}

// writing says whether a process holds a file at or under path open for writing,
// from /proc/<pid>/fd and fdinfo (the processes imagepind may see: all of them, as
// root). A copy over the network from another host is not seen: Settle covers it.
func writing(path string) (bool, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return false, err
	}
	path = filepath.Clean(path)
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || (target != path && !strings.HasPrefix(target, path+"/")) {
				continue
			}
			if forWriting(filepath.Join("/proc", p.Name(), "fdinfo", fd.Name())) {
				return true, nil
			}
		}
	}
	return false, nil
}

// forWriting reads an fdinfo's flags (octal): open write-only or read-write.
func forWriting(fdinfo string) bool {
	f, err := os.Open(fdinfo)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&3 != 0 // O_WRONLY or O_RDWR
		}
	}
	return false
}
