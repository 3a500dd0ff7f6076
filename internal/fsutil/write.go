package fsutil

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteAtomic replaces path with data. The temp file is created in tmpDir, which must be
// on the same filesystem as path; pass "" for path's own directory. CRI-O parses every
// file in its drop-in directory, so the drop-in's temp file must live elsewhere (its parent).
func WriteAtomic(path, tmpDir string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if tmpDir == "" {
		tmpDir = dir
	}
	// The temp name carries at most 200 bytes of the file's name: with the dot, ".tmp-"
	// and CreateTemp's random digits it stays within NAME_MAX (255) for any file name.
	base := filepath.Base(path)
	if len(base) > 200 {
		base = base[:200]
	}
	tmp, err := os.CreateTemp(tmpDir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	tmpName := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmpName)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmpName, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("chmod %s: %w", tmpName, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmpName, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmpName, err)
	}
	if err := os.Rename(tmpName, path); err != nil {
		return fmt.Errorf("rename to %s: %w", path, err)
	}
	ok = true
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so a rename or removal in it survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// RemoveDurable removes path (absent is fine) and fsyncs its directory.
func RemoveDurable(path string) error {
	if err := os.Remove(path); err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	return SyncDir(filepath.Dir(path))
}
