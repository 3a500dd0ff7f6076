package seed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/internal/fsutil"
)

// IngestPrefix starts the store's ingest refs of a seed: never one of imagepind's.
const IngestPrefix = "seed-"

// ErrNoSpace means the store's filesystem has less free space than a medium needs.
var ErrNoSpace = errors.New("not enough free space")

// Config is where seeds go.
type Config struct {
	// Dir keeps the records (Dir(state_dir)).
	Dir string
	// StoreDir is the blob store's directory (for its free space).
	StoreDir string
	// Names are what the media cannot say (Names).
	Names Names
}

// Deps are the seeder's collaborators; nil ones take their defaults.
type Deps struct {
	Store store
	// Free is the free bytes of the filesystem holding dir (default: statfs).
	Free func(dir string) (int64, error)
	// Now is the clock of progress reports (default: time.Now).
	Now func() time.Time
	// Progress is told how the copy goes, at most once a second.
	Progress func(Progress)
}

// Progress is how far a seed is.
type Progress struct {
	Done, Total int64
	// Rate is bytes a second since the copy began; ETA the time left at that rate.
	Rate float64
	ETA  time.Duration
}

// Summary is what a seed did.
type Summary struct {
	ID     string
	Format string
	Images []Image
	// Repositories are the distinct repositories named, Tags the images with a tag.
	Repositories, Tags int
	Manifests, Blobs   int
	// Bytes are all the seed's bytes; Written those this run put in the store (Resumed
	// of them were there from an interrupted run); Present the bytes (and PresentN the
	// manifests and blobs) the store held already.
	Bytes, Written, Resumed, Present int64
	PresentN                         int
	// Recorded: the record was written (false: the same seed was recorded already).
	Recorded bool
}

// Seeder imports media into the store.
type Seeder struct {
	cfg  Config
	deps Deps
}

// New builds a seeder.
func New(cfg Config, deps Deps) *Seeder {
	if deps.Free == nil {
		deps.Free = freeSpace
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	return &Seeder{cfg: cfg, deps: deps}
}

// Seed imports the medium at path: it reads and checks all of it first (nothing is
// stored of a medium found bad), checks the free space, then copies what the store
// lacks, each manifest and blob checked against its digest as it streams in, and
// records the seed once the store holds all of it. A seed cut short resumes when run
// again; one recorded already writes nothing.
func (s *Seeder) Seed(ctx context.Context, path string) (*Summary, error) {
	unlock, err := lock(s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	m, err := openMedia(abs)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	l, err := readLayout(m, s.cfg.Names)
	if err != nil {
		return nil, err
	}
	p, err := makePlan(ctx, m, l, s.deps.Store)
	if err != nil {
		return nil, err
	}
	rec := p.record(m)
	sum := summarize(p, rec)
	need, _, _ := p.need()
	here := Media{Path: abs, Format: l.format, Kind: m.kind}
	old, _ := readRecord(filepath.Join(s.cfg.Dir, rec.ID+recordExt))
	if old != nil {
		rec.Media = old.Media
	}
	known := slices.ContainsFunc(rec.Media, func(o Media) bool { return o.Path == here.Path && o.Format == here.Format })
	if need == 0 && old != nil && known {
		return sum, nil // recorded, and all of it in the store: nothing to write
	}
	if !known {
		here.SeededAt = s.deps.Now().UTC()
		rec.Media = append(rec.Media, here)
	}
	if need > 0 {
		free, err := s.deps.Free(s.cfg.StoreDir)
		if err != nil {
			return nil, fmt.Errorf("free space of the store %s: %w", s.cfg.StoreDir, err)
		}
		if need > free {
			return nil, fmt.Errorf("%s: %w: the store lacks %s of it, the filesystem of %s has %s free",
				abs, ErrNoSpace, bytesText(need), s.cfg.StoreDir, bytesText(free))
		}
		// Pending: imagepind's prune keeps what this seed writes until the record is.
		if err := writeRecord(s.cfg.Dir, rec, pendingExt); err != nil {
			return nil, err
		}
		committed, err := s.copyAll(ctx, m, p, sum)
		if err != nil {
			if errors.Is(err, ErrBadMedia) {
				s.rollback(committed, rec.ID)
			}
			return nil, err
		}
	}
	rec.Complete = true
	if err := writeRecord(s.cfg.Dir, rec, recordExt); err != nil {
		return nil, err
	}
	if err := fsutil.RemoveDurable(filepath.Join(s.cfg.Dir, rec.ID+pendingExt)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	sum.Recorded = true
	// What other media left half written goes: one seed runs at a time (lock).
	_, _, _ = s.deps.Store.ReleaseIngestsOf(ctx, IngestPrefix)
	return sum, nil
}

func summarize(p *plan, rec *Record) *Summary {
	sum := &Summary{ID: rec.ID, Format: p.layout.format, Images: p.images, Manifests: len(rec.Manifests), Blobs: len(rec.Blobs), Bytes: rec.Bytes}
	repos := map[string]bool{}
	for _, i := range p.images {
		if i.Repository != "" {
			repos[i.Repository] = true
		} else if i.MediaName != "" && i.Tag == "" {
			repos[i.MediaName] = true
		}
		if i.Tag != "" {
			sum.Tags++
		}
	}
	sum.Repositories = len(repos)
	_, sum.Present, sum.PresentN = p.need()
	return sum
}

// copyAll writes what the store lacks: the blobs copyWorkers at a time, then the
// manifests in plan order (each after what it names); then it checks the store holds
// all of it (a prune of an imagepind that knows no seeds may take a blob between
// writes: it is written again). It returns what it committed.
func (s *Seeder) copyAll(ctx context.Context, m *media, p *plan, sum *Summary) ([]digest.Digest, error) {
	need, _, _ := p.need()
	pr := &progress{total: need, start: s.deps.Now(), last: s.deps.Now(), now: s.deps.Now, fn: s.deps.Progress}
	var (
		mu        sync.Mutex
		committed []digest.Digest
	)
	copied := func(it *item, c copiedOne, err error) error {
		mu.Lock()
		defer mu.Unlock()
		sum.Written += c.wrote
		sum.Resumed += c.resumed
		if err == nil {
			it.present = true
			if c.committed {
				committed = append(committed, it.Digest)
			}
		}
		return err
	}
	for pass := 0; ; pass++ {
		// Blobs: each streams through its own hash, so two at once use two cores.
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(copyWorkers)
		for _, d := range p.order {
			it := p.items[d]
			if it.present || it.manifest {
				continue
			}
			g.Go(func() error {
				c, err := s.copyOne(gctx, m, it, pr)
				return copied(it, c, err)
			})
		}
		if err := g.Wait(); err != nil {
			return committed, err
		}
		for _, d := range p.order {
			it := p.items[d]
			if it.present {
				continue
			}
			c, err := s.copyOne(ctx, m, it, pr)
			if err := copied(it, c, err); err != nil {
				return committed, err
			}
		}
		lost := 0
		for _, d := range p.order {
			if _, ok := s.deps.Store.Size(ctx, d); !ok {
				it := p.items[d]
				it.present = false
				pr.grow(it.Size)
				lost++
			}
		}
		if lost == 0 {
			return committed, nil
		}
		if pass == 2 {
			return committed, fmt.Errorf("%s: %d blobs went from the store while seeding, three times over: is an imagepind that knows no seeds pruning the store?", m.path, lost)
		}
	}
}

// copyWorkers is how many blobs a seed copies at once: each is hashed (SHA-256) as it
// streams, and two use two cores (a variable for TestSeedSpeed's variants; three and
// four measured no faster).
var copyWorkers = 2

// copyBuf is the size of each read from the medium.
const copyBuf = 256 << 10

// copiedOne is what copyOne did: the bytes it wrote and those it found written, and
// whether this seed committed the blob (false: the store held it already, committed
// by imagepind meanwhile: not the seed's to take away again).
type copiedOne struct {
	wrote, resumed int64
	committed      bool
}

// copyOne streams one manifest or blob into the store, resuming an ingest an
// interrupted seed left.
func (s *Seeder) copyOne(ctx context.Context, m *media, it *item, pr *progress) (copiedOne, error) {
	w, off, err := s.deps.Store.ResumeWriter(ctx, IngestPrefix, it.Digest, it.Size)
	if errors.Is(err, blobstore.ErrExists) {
		pr.add(it.Size) // imagepind committed it meanwhile
		return copiedOne{}, nil
	}
	if err != nil {
		return copiedOne{}, fmt.Errorf("store %s: %w", it.Digest, err)
	}
	rd, _, err := m.open(it.path)
	if err != nil {
		w.Close()
		return copiedOne{}, fmt.Errorf("%s: %w", it.where, err)
	}
	defer rd.Close()
	if _, err := rd.Seek(off, io.SeekStart); err != nil {
		w.Close()
		return copiedOne{}, err
	}
	pr.add(off)
	n, err := io.CopyBuffer(&writeBehind{w: w}, &ctxReader{ctx: ctx, r: io.LimitReader(rd, it.Size-off), pr: pr}, make([]byte, copyBuf))
	done := copiedOne{wrote: n, resumed: off}
	if err != nil {
		w.Close() // the ingest stays, to resume
		return done, fmt.Errorf("%s: %w", it.where, err)
	}
	if off+n != it.Size {
		w.Abandon(ctx, nil) // nil: the writer's own store
		return done, badf("%s: %s: %d bytes, want %d", it.where, it.path, off+n, it.Size)
	}
	if err := w.Commit(ctx); err != nil {
		w.Abandon(ctx, nil) // nil: the writer's own store
		if off > 0 && errdefs.IsFailedPrecondition(err) {
			// What the interrupted run wrote was not this blob's: start it over once.
			pr.add(-it.Size)
			again, err := s.copyOne(ctx, m, it, pr)
			again.wrote += n
			return again, err
		}
		if errdefs.IsFailedPrecondition(err) {
			return done, badf("%s: %s: %v", it.where, it.path, err)
		}
		return done, fmt.Errorf("%s: store: %w", it.where, err)
	}
	w.Close()
	done.committed = true
	return done, nil
}

// rollback deletes what a seed of a bad medium committed (what no other seed names),
// and its pending record: a bad medium stores nothing.
func (s *Seeder) rollback(committed []digest.Digest, id string) {
	_ = fsutil.RemoveDurable(filepath.Join(s.cfg.Dir, id+pendingExt))
	others, err := Digests(s.cfg.Dir)
	if err != nil {
		return
	}
	keep := map[digest.Digest]bool{}
	for _, d := range others {
		keep[d] = true
	}
	ctx := context.Background()
	for _, d := range committed {
		if !keep[d] {
			_ = s.deps.Store.Delete(ctx, d)
		}
	}
	_, _, _ = s.deps.Store.ReleaseIngestsOf(ctx, IngestPrefix)
}

// writebackEvery is how many bytes a seed writes of a blob before it has the disk start
// writing them (Writer.StartWriteback): 4 MiB, the disk's largest request here
// (max_sectors_kb); 1 and 16 MiB measured no faster (TestSeedSpeed).
var writebackEvery int64 = 4 << 20

// writeBehind starts the writeback of each writebackEvery bytes written: the disk
// writes a blob while its next bytes are read and hashed, instead of all of it in the
// fsync of its commit.
type writeBehind struct {
	w       *blobstore.Writer
	pending int64
}

func (b *writeBehind) Write(p []byte) (int, error) {
	n, err := b.w.Write(p)
	b.pending += int64(n)
	if err == nil && writebackEvery > 0 && b.pending >= writebackEvery {
		b.pending = 0
		err = b.w.StartWriteback()
	}
	return n, err
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
	pr  *progress
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	c.pr.add(int64(n))
	return n, err
}

// progress reports the copy at most once a second.
type progress struct {
	mu          sync.Mutex
	done, total int64
	start, last time.Time
	now         func() time.Time
	fn          func(Progress)
}

// grow adds n bytes to copy.
func (p *progress) grow(n int64) {
	p.mu.Lock()
	p.total += n
	p.mu.Unlock()
}

func (p *progress) add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	if p.fn == nil {
		return
	}
	now := p.now()
	if now.Sub(p.last) < time.Second {
		return
	}
	p.last = now
	out := Progress{Done: p.done, Total: p.total}
	if el := now.Sub(p.start).Seconds(); el > 0 {
		out.Rate = float64(p.done) / el
	}
	if out.Rate > 0 && p.total > p.done {
		out.ETA = time.Duration(float64(p.total-p.done) / out.Rate * float64(time.Second))
	}
	p.fn(out)
}

func bytesText(n int64) string {
	if n < 0 {
		n = 0
	}
	return bytesize.Human(uint64(n))
}
