package seed

import (
	"errors"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// freeSpace is what statfs says an unprivileged writer may use of the filesystem
// holding dir, or of its nearest existing parent (a store not made yet).
func freeSpace(dir string) (int64, error) {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, fs.ErrNotExist) || parent == dir {
			return 0, err
		}
		dir = parent
	}
}
