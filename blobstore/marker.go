package blobstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// markerName is the file Open writes at a store's root. Remove deletes only a directory
// holding it, and only what a store keeps there: store_dir may name any directory, and
// a store that was never made is not imagepind's to delete.
const markerName = ".imagepin-blobstore"

const markerText = "This directory is imagepind's blob store of pinned images ([peers] store_dir).\n" +
	"imagepind removes blobs/, ingest/ and this file when [peers] is off; nothing else here.\n"

// mark writes the marker at root, once.
func mark(root string) error {
	file := filepath.Join(root, markerName)
	if _, err := os.Lstat(file); err == nil {
		return nil
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	return fsutil.WriteAtomic(file, root, []byte(markerText), 0o644)
}

// ErrNotAStore is Remove's answer for a directory Open never made a store of.
var ErrNotAStore = errors.New("not a blob store imagepind made (no " + markerName + "): left as it is")

// Remove deletes the store Open made at root: the blobs under blobs/<algorithm>/ named
// by their digest, the ingests under ingest/, the marker, then each of these
// directories and root itself only when that leaves them empty. Anything else under
// root stays. A missing root is not an error; a root without the marker is
// ErrNotAStore, and nothing is deleted.
func Remove(root string) error {
	if _, err := os.Lstat(root); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if fi, err := os.Lstat(filepath.Join(root, markerName)); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w", root, ErrNotAStore)
	}
	var errs []error
	blobs := filepath.Join(root, "blobs")
	algs, _ := os.ReadDir(blobs)
	for _, alg := range algs {
		if !alg.IsDir() || !digest.Algorithm(alg.Name()).Available() {
			continue
		}
		dir := filepath.Join(blobs, alg.Name())
		files, _ := os.ReadDir(dir)
		for _, f := range files {
			if !f.Type().IsRegular() || digest.NewDigestFromEncoded(digest.Algorithm(alg.Name()), f.Name()).Validate() != nil {
				continue
			}
			if err := os.Remove(filepath.Join(dir, f.Name())); err != nil {
				errs = append(errs, err)
			}
		}
		os.Remove(dir) // only when empty
	}
	os.Remove(blobs)
	ingest := filepath.Join(root, "ingest")
	ingests, _ := os.ReadDir(ingest)
	for _, in := range ingests {
		// containerd's local store names each ingest's directory by the digest of its ref.
		if !in.IsDir() || digest.NewDigestFromEncoded(digest.SHA256, in.Name()).Validate() != nil {
			continue
		}
		if err := os.RemoveAll(filepath.Join(ingest, in.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	os.Remove(ingest)
	if len(errs) > 0 {
		return fmt.Errorf("remove blob store %s: %w", root, errors.Join(errs...))
	}
	if err := os.Remove(filepath.Join(root, markerName)); err != nil {
		return fmt.Errorf("remove blob store %s: %w", root, err)
	}
	os.Remove(root) // only when empty
	return nil
}
