// Package blobstore keeps the compressed blobs (and manifests) of pinned images on a
// node whose runtime keeps none: CRI-O stores layers uncompressed and cannot give back
// the bytes their digests name, so a node that serves its pinned images to others
// (peers) keeps its own copy. It is containerd's local content store
// (content-addressed, written through a digest check on commit, ingests that survive a
// kill -9 and are resumed or discarded), used as a library.
package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// ErrBusy means another writer is filling the same blob now; ErrExists that the store
// holds it already.
var (
	ErrBusy   = errors.New("blob being written by another request")
	ErrExists = errors.New("blob already stored")
)

// Store is a content-addressed store of blobs under one directory.
type Store struct {
	cs   content.Store
	root string

	// mu guards open, and makes creating a Writer and releasing ingests one step each:
	// an ingest is either a live Writer's or released, never both.
	mu sync.Mutex
	// open are the ingest refs of this process's live Writers.
	open map[string]bool
}

// Open opens (creating) the store under root, and marks root as a store (Remove).
func Open(root string) (*Store, error) {
	cs, err := local.NewStore(root)
	if err != nil {
		return nil, fmt.Errorf("blob store %s: %w", root, err)
	}
	if err := mark(root); err != nil {
		return nil, fmt.Errorf("blob store %s: %w", root, err)
	}
	return &Store{cs: cs, root: root, open: map[string]bool{}}, nil
}

// Size is the blob's size, and whether the store has it (committed, so verified).
func (s *Store) Size(ctx context.Context, d digest.Digest) (int64, bool) {
	info, err := s.cs.Info(ctx, d)
	if err != nil {
		return 0, false
	}
	return info.Size, true
}

// Reader reads a committed blob; the caller closes it.
func (s *Store) Reader(ctx context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	info, err := s.cs.Info(ctx, d)
	if err != nil {
		return nil, 0, err
	}
	ra, err := s.cs.ReaderAt(ctx, ocispec.Descriptor{Digest: d, Size: info.Size})
	if err != nil {
		return nil, 0, err
	}
	return &readSeeker{SectionReader: io.NewSectionReader(ra, 0, info.Size), ra: ra}, info.Size, nil
}

type readSeeker struct {
	*io.SectionReader
	ra content.ReaderAt
}

func (r *readSeeker) Close() error { return r.ra.Close() }

// Writer starts writing blob d of size bytes (size < 0: unknown). What is written is
// checked against d on Commit; a blob another request is writing gives ErrBusy. An
// ingest left by a killed process is started again from its first byte.
func (s *Store) Writer(ctx context.Context, d digest.Digest, size int64) (*Writer, error) {
	desc := ocispec.Descriptor{Digest: d, Size: size}
	ref := ingestRef(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	w, err := s.cs.Writer(ctx, content.WithRef(ref), content.WithDescriptor(desc))
	if errdefs.IsUnavailable(err) {
		return nil, ErrBusy
	}
	if errdefs.IsAlreadyExists(err) {
		return nil, ErrExists
	}
	if err != nil {
		return nil, err
	}
	if st, err := w.Status(); err == nil && st.Offset > 0 {
		if err := w.Truncate(0); err != nil {
			w.Close()
			return nil, err
		}
	}
	s.open[ref] = true
	return &Writer{w: w, d: d, ref: ref, size: size, s: s}, nil
}

// fillPrefix starts the ingest refs of Writer (imagepind's fills); ReleaseIngests
// releases only those.
const fillPrefix = "blob-"

func ingestRef(d digest.Digest) string { return fillPrefix + d.String() }

// ResumeWriter starts, or resumes, writing blob d of size bytes under the ingest ref
// prefix+d: a writer of another process (imagepinctl seed, prefix "seed-") never shares
// an ingest with imagepind's Writers, and ReleaseIngests leaves its ingests alone
// (ReleaseIngestsOf(prefix) releases them). It returns the bytes an interrupted writer
// of the same ref left (containerd's store re-reads them into the digest when it opens
// the ingest); the caller writes what follows them. A blob the store holds already
// gives ErrExists; one this process is writing under the same ref, ErrBusy. The caller
// keeps two processes from using one prefix at once.
func (s *Store) ResumeWriter(ctx context.Context, prefix string, d digest.Digest, size int64) (*Writer, int64, error) {
	if prefix == "" || prefix == fillPrefix {
		return nil, 0, fmt.Errorf("ingest prefix %q: not one of its own", prefix)
	}
	desc := ocispec.Descriptor{Digest: d, Size: size}
	ref := prefix + d.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	w, err := s.cs.Writer(ctx, content.WithRef(ref), content.WithDescriptor(desc))
	if errdefs.IsUnavailable(err) {
		return nil, 0, ErrBusy
	}
	if errdefs.IsAlreadyExists(err) {
		return nil, 0, ErrExists
	}
	if err != nil {
		return nil, 0, err
	}
	st, err := w.Status()
	if err != nil {
		w.Close()
		return nil, 0, err
	}
	offset := st.Offset
	if offset < 0 || (size >= 0 && offset > size) {
		if err := w.Truncate(0); err != nil {
			w.Close()
			return nil, 0, err
		}
		offset = 0
	}
	s.open[ref] = true
	return &Writer{w: w, d: d, ref: ref, size: size, n: offset, wbDone: offset, s: s}, offset, nil
}

// IngestFile is the file a Writer of d writes, which readers may follow while it grows
// (the bytes are unchecked until Commit; Commit moves the file into the store, an open
// descriptor still reads it). It is where containerd's local store keeps an ingest's
// data (<root>/ingest/<digest of the ref>/data); TestIngestFileGrowsWhileWritten fails
// if a containerd release moves it.
func (s *Store) IngestFile(d digest.Digest) string {
	return s.ingestData(ingestRef(d))
}

// ingestData is the file an ingest of ref writes.
func (s *Store) ingestData(ref string) string {
	return filepath.Join(s.root, "ingest", digest.FromString(ref).Encoded(), "data")
}

// Writer writes one blob.
type Writer struct {
	w    content.Writer
	d    digest.Digest
	ref  string
	size int64
	n    int64
	s    *Store
	once sync.Once
	// wb reads the ingest file for StartWriteback, which has started writing it out up
	// to wbDone.
	wb     *os.File
	wbDone int64
}

// done forgets the Writer's ingest as live (ReleaseIngests may then drop it).
func (w *Writer) done() {
	w.once.Do(func() {
		if w.wb != nil {
			w.wb.Close()
		}
		w.s.mu.Lock()
		delete(w.s.open, w.ref)
		w.s.mu.Unlock()
	})
}

// StartWriteback starts writing to disk the bytes written since its last call, and
// does not wait for them (sync_file_range(2), SYNC_FILE_RANGE_WRITE): the disk writes
// while the writer's next bytes are read and hashed, and Commit's fsync finds little
// left to write. It only starts writeback: a blob is durable, as before, once Commit
// returns. A filesystem that cannot do it is no error.
func (w *Writer) StartWriteback() error {
	if w.n <= w.wbDone {
		return nil
	}
	if w.wb == nil {
		f, err := os.Open(w.s.ingestData(w.ref))
		if err != nil {
			return fmt.Errorf("blob store: writeback of %s: %w", w.d, err)
		}
		w.wb = f
	}
	err := unix.SyncFileRange(int(w.wb.Fd()), w.wbDone, w.n-w.wbDone, unix.SYNC_FILE_RANGE_WRITE)
	if err != nil && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("blob store: writeback of %s: %w", w.d, err)
	}
	w.wbDone = w.n
	return nil
}

func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.n += int64(n)
	return n, err
}

// Commit checks the bytes written against the digest (and the size, when known) and
// makes the blob readable. A blob already committed is not an error.
func (w *Writer) Commit(ctx context.Context) error {
	size := w.size
	if size < 0 {
		size = w.n
	}
	err := w.w.Commit(ctx, size, w.d)
	if errdefs.IsAlreadyExists(err) {
		err = nil
	}
	return err
}

// Abandon drops what was written (a failed or cut transfer). s nil: the writer's own
// store.
func (w *Writer) Abandon(ctx context.Context, s *Store) {
	if s == nil {
		s = w.s
	}
	w.w.Close()
	_ = s.cs.Abort(ctx, w.ref)
	w.done()
}

// Close releases the writer (after Commit). An ingest left uncommitted stays on disk,
// for ReleaseIngests.
func (w *Writer) Close() error {
	defer w.done()
	return w.w.Close()
}

// ReleaseIngests drops every ingest of imagepind's Writers that no live Writer of this
// Store holds: what a killed process (kill -9, a reboot) left half written. It says how
// many went and their bytes. The ingests of ResumeWriter's prefixes (another process's,
// which may be writing them now) stay.
func (s *Store) ReleaseIngests(ctx context.Context) (int, int64, error) {
	return s.ReleaseIngestsOf(ctx, fillPrefix)
}

// ReleaseIngestsOf drops every ingest whose ref starts with prefix that no live Writer
// of this Store holds, and says how many went and their bytes.
func (s *Store) ReleaseIngestsOf(ctx context.Context, prefix string) (int, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	statuses, err := s.cs.ListStatuses(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("blob store ingests: %w", err)
	}
	var n int
	var bytes int64
	for _, st := range statuses {
		if s.open[st.Ref] || !strings.HasPrefix(st.Ref, prefix) {
			continue
		}
		if err := s.cs.Abort(ctx, st.Ref); err != nil && !errdefs.IsNotFound(err) {
			return n, bytes, fmt.Errorf("blob store: releasing ingest %s: %w", st.Ref, err)
		}
		n++
		bytes += st.Offset
	}
	return n, bytes, nil
}

// Delete removes a blob (released after unpin_delay, as pins are).
func (s *Store) Delete(ctx context.Context, d digest.Digest) error {
	err := s.cs.Delete(ctx, d)
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// Usage is the bytes of every committed blob: what the store costs on disk.
func (s *Store) Usage(ctx context.Context) (int64, error) {
	var total int64
	err := s.Walk(ctx, func(_ digest.Digest, size int64) error {
		total += size
		return nil
	})
	return total, err
}

// Walk calls fn for every committed blob; a store that has committed none yet (its
// blobs directory not made: a fresh node) has nothing to walk, which is no error.
func (s *Store) Walk(ctx context.Context, fn func(d digest.Digest, size int64) error) error {
	if _, err := os.Stat(filepath.Join(s.root, "blobs")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	err := s.cs.Walk(ctx, func(info content.Info) error { return fn(info.Digest, info.Size) })
	if err != nil {
		return fmt.Errorf("blob store %s: %w", s.root, err)
	}
	return nil
}
