package seed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// ErrNoSeed means no record matches what Remove was given.
var ErrNoSeed = errors.New("no such seed")

// Removed is what Remove took away.
type Removed struct {
	ID string
	// Blobs and Bytes went from the store; Kept stayed (another seed's, or a pin's).
	Blobs, Kept int
	Bytes       int64
}

// Remove removes a seed, given by its id or by its medium's path: its record (pending
// or complete) first, then the manifests and blobs it names that no other seed names
// and that no pinned reference needs (pinned: the pinner's patterns; a pinned manifest
// keeps what it names, read from the store).
func (s *Seeder) Remove(ctx context.Context, idOrPath string, pinned []string) (*Removed, error) {
	unlock, err := lock(s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	id, err := s.findID(ctx, idOrPath)
	if err != nil {
		return nil, err
	}
	return s.remove(ctx, id, pinned)
}

// Forget takes the medium at path (absolute; it may be gone already) out of the seed
// records that name it, but seed except's (the seed the medium holds now, when it was
// replaced by another at the same path): a seed with another medium left keeps its
// content, and one left with none is removed as Remove removes it. It says what was
// removed (nil: no seed went; ErrNoSeed: no other record names the medium).
func (s *Seeder) Forget(ctx context.Context, path string, pinned []string, except string) ([]*Removed, error) {
	unlock, err := lock(s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	recs, err := Records(s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var out []*Removed
	found := false
	for _, r := range recs {
		if r.ID == except {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(r.Media), func(m Media) bool { return m.Path == path })
		if len(kept) == len(r.Media) {
			continue
		}
		found = true
		if len(kept) > 0 {
			r.Media = kept
			ext := recordExt
			if !r.Complete {
				ext = pendingExt
			}
			if err := writeRecord(s.cfg.Dir, r, ext); err != nil {
				return out, err
			}
			continue
		}
		rm, err := s.remove(ctx, r.ID, pinned)
		if err != nil {
			return out, err
		}
		out = append(out, rm)
	}
	if !found {
		return nil, fmt.Errorf("%s: %w (no seed record names it)", path, ErrNoSeed)
	}
	return out, nil
}

// remove removes seed id's record, then what of it nothing else keeps (Remove); the
// caller holds the lock.
func (s *Seeder) remove(ctx context.Context, id string, pinned []string) (*Removed, error) {
	rec, err := readRecord(filepath.Join(s.cfg.Dir, id+recordExt))
	if errors.Is(err, os.ErrNotExist) {
		rec, err = readRecord(filepath.Join(s.cfg.Dir, id+pendingExt))
	}
	if err != nil {
		return nil, err
	}
	for _, ext := range []string{recordExt, pendingExt} {
		if err := fsutil.RemoveDurable(filepath.Join(s.cfg.Dir, id+ext)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("seed %s: %w", id, err)
		}
	}
	keep, err := s.kept(ctx, pinned)
	if err != nil {
		return nil, fmt.Errorf("seed %s: its record is removed; its blobs stay (imagepind's prune will take them): %w", id, err)
	}
	out := &Removed{ID: id}
	for _, c := range append(append([]Content(nil), rec.Manifests...), rec.Blobs...) {
		if keep[c.Digest] {
			out.Kept++
			continue
		}
		size, ok := s.deps.Store.Size(ctx, c.Digest)
		if !ok {
			continue
		}
		if err := s.deps.Store.Delete(ctx, c.Digest); err != nil {
			return out, fmt.Errorf("seed %s: delete %s: %w", id, c.Digest, err)
		}
		out.Blobs++
		out.Bytes += size
	}
	// What a cut-short seed left half written goes too (one seed runs at a time).
	_, _, _ = s.deps.Store.ReleaseIngestsOf(ctx, IngestPrefix)
	return out, nil
}

// findID is idOrPath's seed id: a recorded id (or a unique prefix of one), else the id
// of the images of the medium at that path.
func (s *Seeder) findID(ctx context.Context, idOrPath string) (string, error) {
	recs, err := Records(s.cfg.Dir)
	if err != nil {
		return "", err
	}
	if len(idOrPath) >= 4 && len(idOrPath) <= 16 && !strings.ContainsRune(idOrPath, os.PathSeparator) {
		var match []string
		for _, r := range recs {
			if strings.HasPrefix(r.ID, idOrPath) {
				match = append(match, r.ID)
			}
		}
		if len(match) == 1 {
			return match[0], nil
		}
		if len(match) > 1 {
			return "", fmt.Errorf("%q: %d seeds have an id starting so: %s", idOrPath, len(match), strings.Join(match, ", "))
		}
	}
	if _, err := os.Stat(idOrPath); err != nil {
		if isID(idOrPath) || errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%q: %w (neither a recorded id nor a medium's path)", idOrPath, ErrNoSeed)
		}
		return "", err
	}
	abs, err := filepath.Abs(idOrPath)
	if err != nil {
		return "", err
	}
	// A medium's path: the seed recorded from it, else the seed of its images.
	for _, r := range recs {
		for _, m := range r.Media {
			if m.Path == abs {
				return r.ID, nil
			}
		}
	}
	m, err := openMedia(abs)
	if err != nil {
		return "", err
	}
	defer m.Close()
	l, err := readLayout(m, s.cfg.Names)
	if err != nil {
		return "", err
	}
	p, err := makePlan(ctx, m, l, s.deps.Store)
	if err != nil {
		return "", err
	}
	id := recordID(p.images)
	for _, r := range recs {
		if r.ID == id {
			return id, nil
		}
	}
	return "", fmt.Errorf("%s: %w (its images are not a recorded seed: id %s)", idOrPath, ErrNoSeed, id)
}

// kept are the digests the other seeds name and those the pinned references need.
func (s *Seeder) kept(ctx context.Context, pinned []string) (map[digest.Digest]bool, error) {
	ds, err := Digests(s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	keep := map[digest.Digest]bool{}
	for _, d := range ds {
		keep[d] = true
	}
	var visit func(d digest.Digest)
	visit = func(d digest.Digest) {
		if keep[d] {
			return
		}
		keep[d] = true
		rd, size, err := s.deps.Store.Reader(ctx, d)
		if err != nil {
			return
		}
		defer rd.Close()
		if size > MaxManifest {
			return // a layer
		}
		data, err := io.ReadAll(rd)
		if err != nil {
			return
		}
		doc, err := parseManifest(data)
		if err != nil {
			return // a layer or a config
		}
		if doc.Config != nil {
			keep[doc.Config.Digest] = true
		}
		for _, l := range doc.Layers {
			keep[l.Digest] = true
		}
		for _, c := range doc.Manifests {
			visit(c.Digest)
		}
	}
	for _, p := range pinned {
		if _, ref, ok := strings.Cut(p, "@"); ok && !strings.Contains(p, "*") {
			if d, err := digest.Parse(ref); err == nil {
				visit(d)
			}
		}
	}
	return keep, nil
}

// Status is a seed as List shows it.
type Status struct {
	*Record
	// Missing are the manifests and blobs of the record the store does not hold.
	Missing int
}

// List shows the recorded seeds, and what of each the store lacks.
func (s *Seeder) List(ctx context.Context) ([]Status, error) {
	recs, err := Records(s.cfg.Dir)
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(recs))
	for _, r := range recs {
		st := Status{Record: r}
		for _, c := range append(append([]Content(nil), r.Manifests...), r.Blobs...) {
			if _, ok := s.deps.Store.Size(ctx, c.Digest); !ok {
				st.Missing++
			}
		}
		out = append(out, st)
	}
	return out, nil
}
