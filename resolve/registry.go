package resolve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/registry"
)

// Result is what one reference resolved to.
type Result struct {
	// From is the reference as written; To is repository@sha256:… (To == From when it
	// was already a canonical digest reference).
	From, To string
	// Tagged is repository:tag@sha256:… for a reference that named a tag: what a set
	// pins to make the nodes know the tag as that digest ("": no tag was named).
	Tagged string
	// Note says what was done beyond a plain tag lookup ("no tag: resolved :latest",
	// "tag dropped").
	Note string
	// List is true when the tag names a manifest list or OCI index: To is the list's
	// digest, which every architecture pulls by; Platforms are its entries.
	List      bool
	Platforms []string
}

// Changed says whether the reference was rewritten.
func (r Result) Changed() bool { return r.From != r.To }

// Registry looks a tag up as the runtime would pull it (its mirrors, certificates and
// credentials): *registry.Client.
type Registry interface {
	ResolveTag(ctx context.Context, image string) (registry.Tag, error)
}

// Resolver looks up tags, each reference once, a bounded number at a time.
type Resolver struct {
	reg Registry
	sem chan struct{}

	mu    sync.Mutex
	cache map[string]*entry
}

type entry struct {
	done chan struct{}
	res  Result
	err  error
}

// NewResolver returns a resolver doing at most concurrency lookups at once.
func NewResolver(reg Registry, concurrency int) *Resolver {
	if concurrency <= 0 {
		concurrency = 8
	}
	return &Resolver{reg: reg, sem: make(chan struct{}, concurrency), cache: map[string]*entry{}}
}

// Resolve returns the digest reference image names. A reference must be fully qualified
// (a short name resolves through search registries, differently on each node); a
// canonical digest reference is returned as it is, without a request.
func (r *Resolver) Resolve(ctx context.Context, image string) (Result, error) {
	r.mu.Lock()
	e, ok := r.cache[image]
	if !ok {
		e = &entry{done: make(chan struct{})}
		r.cache[image] = e
	}
	r.mu.Unlock()
	if ok {
		select {
		case <-e.done:
			return e.res, e.err
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	defer close(e.done)
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		e.err = ctx.Err()
		return Result{}, e.err
	}
	defer func() { <-r.sem }()
	e.res, e.err = r.resolve(ctx, image)
	return e.res, e.err
}

func (r *Resolver) resolve(ctx context.Context, image string) (Result, error) {
	res := Result{From: image}
	named, err := reference.ParseNamed(image)
	if err != nil {
		if errors.Is(err, reference.ErrNameNotCanonical) {
			if norm, nerr := reference.ParseNormalizedNamed(image); nerr == nil {
				return res, fmt.Errorf("%q is not fully qualified: write it as %q (a short name is looked up in each node's search registries, which may differ)", image, norm.String())
			}
		}
		return res, fmt.Errorf("%q is not a valid image reference: %w", image, err)
	}
	if d, ok := named.(reference.Digested); ok {
		if d.Digest().Algorithm() != digest.SHA256 {
			return res, fmt.Errorf("%q: digest must be sha256", image)
		}
		res.To = reference.TrimNamed(named).String() + "@" + d.Digest().String()
		if t, tagged := named.(reference.Tagged); tagged {
			res.Note = "tag dropped: CRI-O pulls by the digest alone"
			res.Tagged = reference.TrimNamed(named).String() + ":" + t.Tag() + "@" + d.Digest().String()
		}
		return res, nil
	}
	t, tagged := named.(reference.Tagged)
	if !tagged {
		res.Note = "no tag: resolved :latest"
		named = reference.TagNameOnly(named)
	}
	tag, err := r.reg.ResolveTag(ctx, image)
	if err != nil {
		return res, err
	}
	res.To = reference.TrimNamed(named).String() + "@" + tag.Digest.String()
	if tagged {
		res.Tagged = reference.TrimNamed(named).String() + ":" + t.Tag() + "@" + tag.Digest.String()
	}
	if tag.List {
		res.List = true
		res.Platforms = platforms(tag.Platforms)
	}
	return res, nil
}

// platforms are a list's platforms, each once, sorted.
func platforms(list []string) []string {
	var out []string
	for _, p := range list {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}
