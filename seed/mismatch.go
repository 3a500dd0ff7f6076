package seed

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// Mismatch is a pinned image whose name the seeds hold with another digest and whose
// digest no seed holds: the medium does not carry the pinned image (a copy that converts
// images, such as skopeo copy without --preserve-digests, writes other bytes and so
// other digests; or the medium holds another version).
type Mismatch struct {
	// Pinned is the reference pinned: repo@sha256:… or repo:tag@sha256:….
	Pinned string
	// Tagged: Pinned names a tag, and Seeded are the seeds' images of that tag; else
	// Seeded are every image the seeds hold of its repository.
	Tagged bool
	Seeded []Seeded
}

// Seeded is a seed's image, with the seed holding it.
type Seeded struct {
	ID    string
	Image Image
}

func (m Mismatch) String() string {
	var held []string
	for _, s := range m.Seeded {
		what := s.Image.Digest.String()
		if !m.Tagged && s.Image.Tag != "" {
			what = s.Image.Tag + "@" + what
		}
		held = append(held, fmt.Sprintf("%s (seed %s)", what, s.ID))
	}
	name := m.Seeded[0].Image.Repository
	if m.Tagged {
		name += ":" + m.Seeded[0].Image.Tag
		return fmt.Sprintf("pinned %s is not seeded: the seeds hold %s as %s: a copy that converted the image "+
			"(skopeo copy without --preserve-digests) changed its digest; seed the registry's own bytes", m.Pinned, name, strings.Join(held, ", "))
	}
	return fmt.Sprintf("pinned %s is not seeded: the seeds hold %s only as %s: another version, or a copy that converted the image "+
		"(skopeo copy without --preserve-digests)", m.Pinned, name, strings.Join(held, ", "))
}

// Mismatches are the pinned references (repo@digest, repo:tag@digest) whose digest no
// complete seed holds (as an image or an index's child), while a seed holds an image of
// the same repository, and of the same tag when the reference names one: the seeded
// medium was meant to carry the pinned image and carries other bytes. References
// without a digest, or that do not parse, are left out.
func Mismatches(recs []*Record, pinned []string) []Mismatch {
	held := map[digest.Digest]bool{}
	byRepo := map[string][]Seeded{}
	for _, r := range recs {
		if !r.Complete {
			continue
		}
		for _, c := range r.Manifests {
			held[c.Digest] = true
		}
		for _, i := range r.Images {
			if i.Repository != "" {
				byRepo[i.Repository] = append(byRepo[i.Repository], Seeded{ID: r.ID, Image: i})
			}
		}
	}
	var out []Mismatch
	seen := map[string]bool{}
	for _, p := range pinned {
		if seen[p] {
			continue
		}
		seen[p] = true
		ref, err := reference.ParseNormalizedNamed(p)
		if err != nil {
			continue
		}
		dg, ok := ref.(reference.Digested)
		if !ok || held[dg.Digest()] {
			continue
		}
		m := Mismatch{Pinned: p}
		tag, tagged := ref.(reference.Tagged)
		m.Tagged = tagged
		for _, s := range byRepo[ref.Name()] {
			if !tagged || s.Image.Tag == tag.Tag() {
				m.Seeded = append(m.Seeded, s)
			}
		}
		if len(m.Seeded) == 0 {
			continue
		}
		sort.Slice(m.Seeded, func(i, j int) bool {
			a, b := m.Seeded[i], m.Seeded[j]
			if a.Image.Tag != b.Image.Tag {
				return a.Image.Tag < b.Image.Tag
			}
			if a.Image.Digest != b.Image.Digest {
				return a.Image.Digest < b.Image.Digest
			}
			return a.ID < b.ID
		})
		out = append(out, m)
	}
	// A set's repo:tag@digest is pinned as repo@digest too: said once, with its tag.
	tagged := map[string]bool{}
	for _, m := range out {
		if m.Tagged {
			tagged[untag(m.Pinned)] = true
		}
	}
	out = slices.DeleteFunc(out, func(m Mismatch) bool { return !m.Tagged && tagged[untag(m.Pinned)] })
	sort.Slice(out, func(i, j int) bool { return out[i].Pinned < out[j].Pinned })
	return out
}

// untag is repo:tag@digest as repo@digest.
func untag(ref string) string {
	r, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return ref
	}
	d, ok := r.(reference.Digested)
	if !ok {
		return ref
	}
	c, err := reference.WithDigest(reference.TrimNamed(r), d.Digest())
	if err != nil {
		return ref
	}
	return c.String()
}
