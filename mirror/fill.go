package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/blobstore"
)

// stallTimeout ends a fill whose source sent nothing for this long (the next request
// starts over, from another source).
var stallTimeout = 60 * time.Second

// fill is one blob being written to the store by one transfer from a source, read by
// every request for it while it arrives (they read the store's ingest file up to what
// was written). Only a complete blob that matches its digest ends a reader with io.EOF.
type fill struct {
	file string // the store's ingest file

	size int64 // the descriptor's: the fill stops there

	mu     sync.Mutex
	cond   *sync.Cond
	opened bool  // the source answered
	n      int64 // bytes written so far
	done   bool
	err    error // why the fill failed (done)
}

func (f *fill) update(fn func()) {
	f.mu.Lock()
	fn()
	f.mu.Unlock()
	f.cond.Broadcast()
}

// open reads blob d of size bytes (its descriptor's): from the fill under way, else a
// new fill from src, else (the store cannot take it: a full disk) straight from src.
// It says the whole blob's size.
func (m *Mirror) open(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64, src Source) (*blobReader, int64, error) {
	m.mu.Lock()
	f := m.fills[d]
	skipStore := time.Since(m.storeFailed) < time.Minute
	if m.closed {
		m.mu.Unlock()
		return nil, 0, errClosed
	}
	if f == nil && !skipStore {
		var err error
		f, err = m.startFill(ctx, repo, chain, d, size, src)
		switch {
		case err == nil:
		case errors.Is(err, blobstore.ErrExists):
			// A fill ended between the caller's look into the store and now.
			m.mu.Unlock()
			return m.stored(ctx, d)
		case errors.Is(err, blobstore.ErrBusy):
			// The store's own lock: a fill ending right now. Stream alone.
		default:
			m.storeFailed = time.Now()
			m.log.WithError(err).Warn("mirror: the blob store cannot take a blob; streaming without storing it for a minute")
		}
	}
	m.mu.Unlock()
	if f == nil {
		return m.direct(ctx, repo, chain, d, size, src)
	}
	// Wait until the source answered or the fill failed.
	stop := context.AfterFunc(ctx, func() { f.update(func() {}) })
	defer stop()
	f.mu.Lock()
	for !f.opened && !f.done && ctx.Err() == nil {
		f.cond.Wait()
	}
	err := f.err
	f.mu.Unlock()
	if ctx.Err() != nil {
		return nil, 0, ctx.Err()
	}
	if err != nil {
		return nil, 0, err
	}
	return &blobReader{ctx: ctx, f: f, m: m, d: d}, f.size, nil
}

// startFill starts filling blob d of size bytes from src into the store, m.mu held:
// blobstore.ErrExists when the store holds it already, ErrBusy when its own lock is
// held (a fill ending now), another error when the store cannot take it.
func (m *Mirror) startFill(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64, src Source) (*fill, error) {
	sw, err := m.store.Writer(context.WithoutCancel(ctx), d, -1)
	if err != nil {
		return nil, err
	}
	f := &fill{file: m.store.IngestFile(d), size: size}
	f.cond = sync.NewCond(&f.mu)
	m.fills[d] = f
	m.running.Add(1)
	go func() {
		defer m.running.Done()
		m.run(f, sw, repo, chain, d, src)
	}()
	return f, nil
}

// errClosed is a request to a closed mirror.
var errClosed = errors.New("the mirror is closed")

// Close ends every fill under way (each abandons what it wrote) and waits for them;
// the mirror fills nothing after.
func (m *Mirror) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.stop()
	m.running.Wait()
}

// stored reads the stored blob d (from the store, else from the runtime's content
// store), checked against d as it is read: a stored copy corrupted on disk ends the
// reader with an error, not io.EOF (corrupt: the mirror's own copy leaves the store,
// the runtime's is read no more), and the next request fills it again.
func (m *Mirror) stored(ctx context.Context, d digest.Digest) (*blobReader, int64, error) {
	rd, size, own, err := m.storedReader(ctx, d)
	if err != nil {
		return nil, 0, err
	}
	return &blobReader{ctx: ctx, m: m, d: d, src: rd, verifier: d.Verifier(), stored: true, ownStore: own}, size, nil
}

// run is the fill's one transfer: from src into the store, committed (checked against
// d) at the end.
func (m *Mirror) run(f *fill, sw *blobstore.Writer, repo string, chain []digest.Digest, d digest.Digest, src Source) {
	ctx, cancel := context.WithCancel(m.ctx)
	defer cancel()
	err := m.transfer(ctx, cancel, f, sw, repo, chain, d, src)
	if err != nil {
		sw.Abandon(context.Background(), m.store)
	} else {
		sw.Close()
		if m.onFilled != nil {
			m.onFilled()
		}
	}
	m.mu.Lock()
	delete(m.fills, d)
	m.mu.Unlock()
	f.update(func() { f.done, f.err = true, err })
}

func (m *Mirror) transfer(ctx context.Context, cancel func(), f *fill, sw *blobstore.Writer, repo string, chain []digest.Digest, d digest.Digest, src Source) error {
	stall := time.AfterFunc(stallTimeout, cancel)
	defer stall.Stop()
	body, err := openBounded(ctx, src, repo, chain, d, f.size)
	if err != nil {
		return err
	}
	defer body.Close()
	f.update(func() { f.opened = true })
	buf := make([]byte, 64<<10)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			stall.Reset(stallTimeout)
			if _, err := sw.Write(buf[:n]); err != nil {
				m.mu.Lock()
				m.storeFailed = time.Now()
				m.mu.Unlock()
				m.log.WithError(err).Warn("mirror: the blob store cannot take a blob; streaming without storing it for a minute")
				return fmt.Errorf("blob store: %w", err)
			}
			f.update(func() { f.n += int64(n) })
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("the source sent nothing for %s: %w", stallTimeout, rerr)
			}
			return rerr
		}
	}
	if err := sw.Commit(ctx); err != nil {
		return fmt.Errorf("%s: %w", d, err)
	}
	return nil
}

// openBounded is src's stream of blob d, refused when its sender announces another
// size than the descriptor's, and ended with an error (not io.EOF) past size bytes or
// short of them.
func openBounded(ctx context.Context, src Source, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, error) {
	body, announced, err := src.Blob(ctx, repo, chain, d, size)
	if err != nil {
		return nil, err
	}
	return Bound(d, body, announced, size, "source")
}

// Bound is body, the blob d of size bytes that sender announced as announced (-1: not
// announced), refused (closed, ErrSize) when the announced size is another, else read
// through Bounded. Every Source keeps its Blob to this, and so does every fill.
func Bound(d digest.Digest, body io.ReadCloser, announced, size int64, sender string) (io.ReadCloser, error) {
	if announced >= 0 && announced != size {
		body.Close()
		return nil, fmt.Errorf("%s: the %s announced %d bytes, the manifest gives %d: %w", d, sender, announced, size, ErrSize)
	}
	return &Bounded{ReadCloser: body, Left: size}, nil
}

// ErrSize is a blob longer or shorter than its descriptor says.
var ErrSize = errors.New("not the size the manifest gives")

// Bounded reads at most Left bytes of a blob: it ends with io.EOF only when the
// blob ends after exactly Left bytes, with ErrSize when more come, and with
// io.ErrUnexpectedEOF when it ends short.
type Bounded struct {
	io.ReadCloser
	Left int64
}

func (b *Bounded) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.Left <= 0 {
		// Every byte came: only the end may follow.
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("more bytes than the manifest gives: %w", ErrSize)
		}
		return 0, err
	}
	n, err := b.ReadCloser.Read(p[:min(int64(len(p)), b.Left)])
	b.Left -= int64(n)
	if err == io.EOF && b.Left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// direct streams blob d from src without storing it (the store cannot take it),
// checking it against d: a mismatch ends the reader with an error, not io.EOF.
func (m *Mirror) direct(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64, src Source) (*blobReader, int64, error) {
	body, err := openBounded(ctx, src, repo, chain, d, size)
	if err != nil {
		return nil, 0, err
	}
	return &blobReader{ctx: ctx, m: m, d: d, src: body, verifier: d.Verifier()}, size, nil
}

// blobReader reads a fill, a direct stream or a stored blob, from its first byte.
type blobReader struct {
	ctx context.Context
	m   *Mirror
	d   digest.Digest

	// a fill's
	f    *fill
	off  int64
	file io.ReadSeekCloser

	// a direct stream's, or a stored blob's (stored; ownStore: in the mirror's store,
	// else in the runtime's content store)
	src      io.ReadCloser
	verifier digest.Verifier
	stored   bool
	ownStore bool
}

func (r *blobReader) Read(p []byte) (int, error) {
	if r.src != nil {
		n, err := r.src.Read(p)
		if r.verifier == nil {
			return n, err
		}
		r.verifier.Write(p[:n])
		if err == io.EOF && !r.verifier.Verified() {
			err = fmt.Errorf("the source sent bytes that do not match %s", r.d)
			if r.stored {
				err = r.m.corrupt(r.ctx, r.d, r.ownStore, "blob")
			}
		}
		return n, err
	}
	f := r.f
	stop := context.AfterFunc(r.ctx, func() { f.update(func() {}) })
	defer stop()
	f.mu.Lock()
	for r.off >= f.n && !f.done && r.ctx.Err() == nil {
		f.cond.Wait()
	}
	written, done, ferr := f.n, f.done, f.err
	f.mu.Unlock()
	switch {
	case r.ctx.Err() != nil:
		return 0, r.ctx.Err()
	case r.off < written:
		if err := r.openFile(done); err != nil {
			return 0, err
		}
		n, err := r.file.Read(p[:min(int64(len(p)), written-r.off)])
		r.off += int64(n)
		if err == io.EOF && n > 0 {
			err = nil
		}
		return n, err
	case ferr != nil:
		return 0, ferr
	default:
		return 0, io.EOF
	}
}

// openFile opens the fill's ingest file at r.off, or, once the fill committed it, the
// stored blob.
func (r *blobReader) openFile(done bool) error {
	if r.file != nil {
		return nil
	}
	file, err := os.Open(r.f.file)
	if errors.Is(err, os.ErrNotExist) {
		// Committed (moved into the store) since: wait for the fill to say so.
		r.f.mu.Lock()
		for !r.f.done && r.ctx.Err() == nil {
			r.f.cond.Wait()
		}
		ferr := r.f.err
		r.f.mu.Unlock()
		if ferr != nil {
			return ferr
		}
		rd, _, err := r.m.store.Reader(r.ctx, r.d)
		if err != nil {
			return err
		}
		r.file = rd
	} else if err != nil {
		return err
	} else {
		r.file = file
	}
	_, err = r.file.Seek(r.off, io.SeekStart)
	return err
}

// skip moves the reader n bytes on without handing them out: a fill's reader moves
// there (what the fill writes is checked by the fill); a stream's, stored or direct,
// reads the bytes between and checks them as any it reads.
func (r *blobReader) skip(n int64) error {
	if r.src != nil {
		_, err := io.CopyN(io.Discard, r, n)
		return err
	}
	r.off += n
	if r.file != nil {
		if _, err := r.file.Seek(r.off, io.SeekStart); err != nil {
			return err
		}
	}
	return nil
}

func (r *blobReader) Close() error {
	if r.file != nil {
		r.file.Close()
	}
	if r.src != nil {
		r.src.Close()
	}
	return nil
}
