package setgen

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// Image is one image to pin.
type Image struct {
	// Ref is repository@sha256:…, fully qualified.
	Ref string
	// Tags are the tagged references (repository:tag) the workloads name it by, sorted.
	Tags []string
	// From are the containers that run it ("pod shop/web-1 container web"), sorted.
	From []string
}

// Warning is an image left out of the set, and why.
type Warning struct {
	// Where is the container: "pod shop/web-1 container web".
	Where string
	// Image is the image as the object names it.
	Image string
	// Reason says what is wrong and how to fix it.
	Reason string
}

func (w Warning) String() string { return fmt.Sprintf("%s: %s: %s", w.Where, w.Image, w.Reason) }

// Result is a set's images and what was left out.
type Result struct {
	// Images are sorted by Ref, each once.
	Images   []Image
	Warnings []Warning
	// Notes are images kept, with something worth knowing (pinned under another
	// repository than the runtime reports).
	Notes []Warning
}

// Refs are the images' digest references.
func (r Result) Refs() []string {
	out := make([]string, len(r.Images))
	for i, img := range r.Images {
		out[i] = img.Ref
	}
	return out
}

// ErrNoRegistryDigest: the runtime knows the image only by its local ID (built or
// loaded on the node, never pulled from a registry by digest).
var ErrNoRegistryDigest = errors.New("the runtime reports a local image ID, not a registry digest")

// localID is an image ID without a repository: sha256:<hex> or <hex>.
var localID = regexp.MustCompile(`^(sha256:)?[0-9a-f]{64}$`)

// parseImageID reads a container status's imageID as a digest reference. The kubelet
// writes what the runtime reports: CRI-O and containerd "repo@sha256:…", Docker
// "docker-pullable://repo@sha256:…"; an image with no registry digest is "sha256:…"
// (or docker://sha256:…).
func parseImageID(id string) (reference.Canonical, error) {
	s := strings.TrimPrefix(strings.TrimPrefix(id, "docker-pullable://"), "docker://")
	if s == "" {
		return nil, errors.New("no image ID yet: the container has not been created (image not pulled?)")
	}
	if localID.MatchString(s) {
		return nil, ErrNoRegistryDigest
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return nil, fmt.Errorf("image ID %q is not a digest reference: %w", id, err)
	}
	c, ok := named.(reference.Canonical)
	if !ok {
		return nil, fmt.Errorf("image ID %q has no digest", id)
	}
	if err := checkDigest(c.Digest()); err != nil {
		return nil, fmt.Errorf("image ID %q: %w", id, err)
	}
	return c, nil
}

func checkDigest(d digest.Digest) error {
	if d.Algorithm() != digest.SHA256 || len(d.Encoded()) != 64 {
		return fmt.Errorf("digest %s: want sha256 with 64 hex digits", d)
	}
	return nil
}

// specName is the image a pod or template names: its repository (normalized), its tag
// if it names one, and whether it was written fully qualified.
type specName struct {
	repo      reference.Named
	tag       string
	qualified bool
}

func parseSpec(image string) (specName, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return specName{}, fmt.Errorf("not a valid image reference: %w", err)
	}
	_, qerr := reference.ParseNamed(image)
	s := specName{repo: reference.TrimNamed(named), qualified: qerr == nil}
	if t, ok := named.(reference.Tagged); ok {
		s.tag = t.Tag()
	}
	return s, nil
}

// collector gathers images, each once, and warnings.
type collector struct {
	images   map[string]*Image
	warnings []Warning
	notes    []Warning
}

func newCollector() *collector { return &collector{images: map[string]*Image{}} }

// add records repo@dgst, named by tag (repository:tag; "" none) in where.
func (c *collector) add(repo reference.Named, dgst digest.Digest, tag, where string) {
	ref := repo.Name() + "@" + dgst.String()
	img, ok := c.images[ref]
	if !ok {
		img = &Image{Ref: ref}
		c.images[ref] = img
	}
	if tag != "" {
		t := repo.Name() + ":" + tag
		if !slices.Contains(img.Tags, t) {
			img.Tags = append(img.Tags, t)
		}
	}
	if !slices.Contains(img.From, where) {
		img.From = append(img.From, where)
	}
}

func (c *collector) warn(where, image, reason string) {
	c.warnings = append(c.warnings, Warning{Where: where, Image: image, Reason: reason})
}

func (c *collector) note(where, image, what string) {
	c.notes = append(c.notes, Warning{Where: where, Image: image, Reason: what})
}

func (c *collector) result() Result {
	var r Result
	for _, img := range c.images {
		sort.Strings(img.Tags)
		sort.Strings(img.From)
		r.Images = append(r.Images, *img)
	}
	sort.Slice(r.Images, func(i, j int) bool { return r.Images[i].Ref < r.Images[j].Ref })
	r.Warnings, r.Notes = c.warnings, c.notes
	return r
}
