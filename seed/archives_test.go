package seed

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// archiveDir is a directory of oc-mirror's archives: one mirror_000001.tar of a
// registry's storage holding the OCI layout's images.
func archiveDir(t *testing.T, o *ociMedia) (dir, archive string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "cache")
	writeDistribution(t, o, root)
	dir = filepath.Join(t.TempDir(), "oc-mirror")
	must(t, os.MkdirAll(dir, 0o755))
	archive = filepath.Join(dir, "mirror_000001.tar")
	tarDir(t, root, archive, func(h *tar.Header) bool { h.Name = strings.TrimPrefix(h.Name, "./"); return true })
	return dir, archive
}

// seedWithin seeds path, failing the test (not hanging it) when the seed takes longer
// than a few seconds.
func seedWithin(t *testing.T, e *env, path string) (*Summary, error) {
	t.Helper()
	type result struct {
		sum *Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := e.seeder.Seed(context.Background(), path)
		done <- result{sum, err}
	}()
	select {
	case r := <-done:
		return r.sum, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("seeding %s: no answer after 10s (blocked on a FIFO?)", path)
		return nil, nil
	}
}

// A FIFO named like an oc-mirror archive is refused at once, naming it: a blocking
// open of it would wait for a writer for ever.
func TestAFIFONamedLikeAnArchiveIsRefused(t *testing.T) {
	o := writeOCI(t, 20)
	dir, archive := archiveDir(t, o)
	must(t, os.Rename(archive, filepath.Join(dir, "mirror_000002.tar")))
	must(t, syscall.Mkfifo(archive, 0o644))
	e := newEnv(t, Deps{})
	e.seeder.cfg.Names.Registry = "quay.io"
	_, err := seedWithin(t, e, dir)
	if !errors.Is(err, ErrBadMedia) || !strings.Contains(err.Error(), "mirror_000001.tar") || !strings.Contains(err.Error(), "a FIFO") {
		t.Fatalf("got %v, want the FIFO refused by name", err)
	}
	if len(e.blobs(t)) != 0 || len(e.records(t)) != 0 {
		t.Fatalf("stored %v, recorded %v", e.blobs(t), e.records(t))
	}
}

// A symlinked oc-mirror archive leading out of the directory is refused, as the files
// of the other formats are; one leading to an archive inside it is read.
func TestASymlinkedArchiveOutOfTheMediumIsRefused(t *testing.T) {
	o := writeOCI(t, 21)
	dir, archive := archiveDir(t, o)
	outside := filepath.Join(t.TempDir(), "elsewhere.tar")
	must(t, os.Rename(archive, outside))
	must(t, os.Symlink(outside, archive))
	e := newEnv(t, Deps{})
	e.seeder.cfg.Names.Registry = "quay.io"
	_, err := seedWithin(t, e, dir)
	if !errors.Is(err, ErrBadMedia) || !strings.Contains(err.Error(), "mirror_000001.tar: a symlink leading out of") {
		t.Fatalf("got %v, want the link out of the medium refused", err)
	}
	if len(e.blobs(t)) != 0 || len(e.records(t)) != 0 {
		t.Fatalf("stored %v, recorded %v", e.blobs(t), e.records(t))
	}
	// Inside the medium: read.
	inside := filepath.Join(dir, "archives", "first.tar")
	must(t, os.MkdirAll(filepath.Dir(inside), 0o755))
	must(t, os.Remove(archive))
	must(t, os.Rename(outside, inside))
	must(t, os.Symlink(inside, archive))
	if _, err := seedWithin(t, e, dir); err != nil {
		t.Fatalf("a link to an archive inside the medium: %v", err)
	}
	wantAll(t, e, contentOf(t, o.named))
}
