package blobstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"
)

func blob(t *testing.T, n int) ([]byte, digest.Digest) {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return b, digest.FromBytes(b)
}

func TestWriteCommitRead(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, d := blob(t, 1<<20)
	w, err := s.Writer(ctx, d, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(w, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if size, ok := s.Size(ctx, d); !ok || size != int64(len(b)) {
		t.Fatalf("size %d %v", size, ok)
	}
	r, size, err := s.Reader(ctx, d)
	if err != nil || size != int64(len(b)) {
		t.Fatal(err, size)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, b) {
		t.Fatal("read back other bytes")
	}
	if u, err := s.Usage(ctx); err != nil || u != int64(len(b)) {
		t.Fatalf("usage %d %v", u, err)
	}
	if err := s.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Size(ctx, d); ok {
		t.Fatal("deleted blob still there")
	}
	if err := s.Delete(ctx, d); err != nil {
		t.Fatalf("deleting a missing blob: %v", err)
	}
}

// Bytes that do not match the digest are never readable: a peer or registry serving
// garbage costs a retry, never wrong content.
func TestWrongBytesAreRefused(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(t.TempDir())
	b, d := blob(t, 4096)
	w, err := s.Writer(ctx, d, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), b...)
	bad[100] ^= 0xff
	w.Write(bad)
	if err := w.Commit(ctx); err == nil {
		t.Fatal("corrupted bytes committed")
	}
	w.Abandon(ctx, s)
	if _, ok := s.Size(ctx, d); ok {
		t.Fatal("corrupted blob readable")
	}
	// The same digest can be written again, correctly.
	w, err = s.Writer(ctx, d, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(b)
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// One writer per blob at a time; an ingest left by a killed process (never closed,
// never committed) is started again from its first byte after a restart.
func TestBusyAndKilledIngest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, _ := Open(dir)
	b, d := blob(t, 64<<10)
	w, err := s.Writer(ctx, d, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(b[:1000])
	if _, err := s.Writer(ctx, d, int64(len(b))); !errors.Is(err, ErrBusy) {
		t.Fatalf("second writer: %v, want ErrBusy", err)
	}
	// "kill -9": the first writer is never closed; a new process opens the store.
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s2.Writer(ctx, d, int64(len(b)))
	if err != nil {
		t.Fatalf("a new store after a killed ingest: %v", err)
	}
	w2.Write(b)
	if err := w2.Commit(ctx); err != nil {
		t.Fatalf("commit after a killed ingest: %v", err)
	}
	w2.Close()
	if size, ok := s2.Size(ctx, d); !ok || size != int64(len(b)) {
		t.Fatalf("size %d %v", size, ok)
	}
}

// Readers follow a blob while it is written by reading the ingest file: it must be
// where IngestFile says, hold what was written so far, and stay readable through an
// open descriptor after Commit moves it.
func TestIngestFileGrowsWhileWritten(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := bytes.Repeat([]byte("imagepin"), 8192)
	d := digest.FromBytes(data)
	w, err := s.Writer(ctx, d, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[:1000]); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(s.IngestFile(d))
	if err != nil {
		t.Fatalf("the ingest file is not where IngestFile says: %v", err)
	}
	defer f.Close()
	got, _ := io.ReadAll(f)
	if !bytes.Equal(got, data[:1000]) {
		t.Fatalf("the ingest file holds %d bytes, want the 1000 written", len(got))
	}
	if _, err := w.Write(data[1000:]); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.Close()
	rest, _ := io.ReadAll(f)
	if !bytes.Equal(append(got, rest...), data) {
		t.Fatal("the descriptor opened before Commit does not read the whole blob after it")
	}
	if _, err := os.Stat(s.IngestFile(d)); !os.IsNotExist(err) {
		t.Fatalf("the ingest file is still there after Commit: %v", err)
	}
}

// A fresh store (no blob committed yet) walks nothing, without an error: an empty
// store is normal.
func TestWalkAnEmptyStore(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Walk(ctx, func(digest.Digest, int64) error { t.Fatal("a blob in an empty store"); return nil }); err != nil {
		t.Fatalf("walking an empty store: %v", err)
	}
	if u, err := s.Usage(ctx); err != nil || u != 0 {
		t.Fatalf("usage of an empty store: %d %v", u, err)
	}
}

// An ingest a killed process left is released; a live Writer's is not.
func TestReleaseIngestsLeftByAKill(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	killed, _ := Open(dir)
	b, d := blob(t, 64<<10)
	w, err := killed.Writer(ctx, d, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(b[:1000]) // "kill -9": never closed, never committed
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	live, ld := blob(t, 4096)
	lw, err := s.Writer(ctx, ld, int64(len(live)))
	if err != nil {
		t.Fatal(err)
	}
	lw.Write(live[:100])
	n, bytes, err := s.ReleaseIngests(ctx)
	if err != nil || n != 1 || bytes != 1000 {
		t.Fatalf("released %d ingests, %d bytes, %v; want the killed one's 1000 bytes", n, bytes, err)
	}
	if _, err := os.Stat(s.IngestFile(d)); !os.IsNotExist(err) {
		t.Fatalf("the killed process's ingest is still there: %v", err)
	}
	lw.Write(live[100:])
	if err := lw.Commit(ctx); err != nil {
		t.Fatalf("the live writer, after a release: %v", err)
	}
	lw.Close()
	if n, _, err := s.ReleaseIngests(ctx); err != nil || n != 0 {
		t.Fatalf("a second release: %d, %v", n, err)
	}
}

// Another process's ingests (ResumeWriter's prefix) outlive imagepind's ReleaseIngests,
// and a new ResumeWriter of the same ref goes on from where the killed one stopped.
func TestResumeWriterAfterAKill(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	killed, _ := Open(dir)
	b, d := blob(t, 64<<10)
	w, off, err := killed.ResumeWriter(ctx, "seed-", d, int64(len(b)))
	if err != nil || off != 0 {
		t.Fatalf("first writer: offset %d, %v", off, err)
	}
	w.Write(b[:1000]) // "kill -9"
	daemon, _ := Open(dir)
	if n, _, err := daemon.ReleaseIngests(ctx); err != nil || n != 0 {
		t.Fatalf("imagepind released %d ingests of another prefix (%v)", n, err)
	}
	s, _ := Open(dir)
	w2, off, err := s.ResumeWriter(ctx, "seed-", d, int64(len(b)))
	if err != nil || off != 1000 {
		t.Fatalf("resumed writer: offset %d, %v; want 1000", off, err)
	}
	w2.Write(b[off:])
	if err := w2.Commit(ctx); err != nil {
		t.Fatalf("commit of a resumed ingest: %v", err)
	}
	w2.Close()
	if _, _, err := s.ResumeWriter(ctx, "seed-", d, int64(len(b))); !errors.Is(err, ErrExists) {
		t.Fatalf("a committed blob: %v, want ErrExists", err)
	}
	if _, _, err := s.ResumeWriter(ctx, "blob-", d, int64(len(b))); err == nil {
		t.Fatal("ResumeWriter took imagepind's own prefix")
	}
	// A left ingest of the prefix goes with ReleaseIngestsOf.
	c, cd := blob(t, 4096)
	w3, _, _ := s.ResumeWriter(ctx, "seed-", cd, int64(len(c)))
	w3.Write(c[:10])
	w3.Close()
	if n, bytes, err := s.ReleaseIngestsOf(ctx, "seed-"); err != nil || n != 1 || bytes != 10 {
		t.Fatalf("ReleaseIngestsOf: %d ingests, %d bytes, %v", n, bytes, err)
	}
}

// StartWriteback has the disk start writing what a Writer wrote, without waiting for
// it: the ingest's pages stop being dirty soon after (the kernel's own writeback would
// leave them for dirty_expire_centisecs, 30 s by default). The blob commits as before,
// and no descriptor of the Writer outlives it.
func TestStartWritebackWritesOutWhatWasWritten(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is on tmpfs (or statfs failed: %v): no writeback to see", dir, err)
	}
	s, _ := Open(dir)
	b, d := blob(t, 8<<20)
	w, _, err := s.ResumeWriter(ctx, "seed-", d, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	half := len(b) / 2
	w.Write(b[:half])
	f, err := os.Open(s.ingestData("seed-" + d.String()))
	if err != nil {
		t.Fatal(err)
	}
	dirty := func() uint64 {
		var st unix.Cachestat_t
		if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &st, 0); err != nil {
			t.Skipf("cachestat(2): %v", err)
		}
		return st.Dirty + st.Writeback
	}
	if dirty() == 0 {
		f.Close()
		t.Skip("nothing dirty right after the write: something synced the filesystem")
	}
	if err := w.StartWriteback(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for dirty() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d pages still dirty or under writeback 5 s after StartWriteback", dirty())
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.Close()
	w.Write(b[half:])
	if err := w.StartWriteback(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	w.Close()
	rd, _, err := s.Reader(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rd)
	rd.Close()
	if !bytes.Equal(got, b) {
		t.Fatal("the committed blob is not what was written")
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, e := range fds {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.Contains(l, d.Encoded()) {
			t.Fatalf("descriptor %s still open on %s after Close", e.Name(), l)
		}
	}
}
