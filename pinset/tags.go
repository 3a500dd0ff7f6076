package pinset

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/distribution/reference"
)

// Tag is a tag a set pins: Name (repo:tag) is made to mean Image (repo@sha256:…) on
// the node, whatever the registry says of it later.
type Tag struct {
	Name  string
	Image string
}

// Repo is the tag's repository (quay.io/ns/app).
func (t Tag) Repo() string { r, _, _ := strings.Cut(t.Image, "@"); return r }

// TagOnly is the tag alone (v2).
func (t Tag) TagOnly() string { return t.Name[len(t.Repo())+1:] }

// Digest is the pinned digest (sha256:…).
func (t Tag) Digest() string { _, d, _ := strings.Cut(t.Image, "@"); return d }

// ParsePinned reads one spec.pinnedImages entry: repo@sha256:… or repo:tag@sha256:…,
// fully qualified. image is the digest reference (without the tag); tag is empty for
// an entry without one.
func ParsePinned(name string) (image string, tag Tag, err error) {
	if len(name) > 1024 {
		return "", Tag{}, errors.New("reference longer than 1024 characters")
	}
	ref, err := reference.ParseNamed(name)
	if err != nil {
		// ValidateImage words the error (not fully qualified, not a reference).
		return "", Tag{}, ValidateImage(name)
	}
	tagged, isTagged := ref.(reference.Tagged)
	digested, isDigested := ref.(reference.Digested)
	if !isDigested {
		if isTagged {
			return "", Tag{}, fmt.Errorf("%q is not by digest (a tag alone): pin it as %s@sha256:<64 hex digits> (imagepinctl resolve --keep-tags writes that)", name, name)
		}
		return "", Tag{}, fmt.Errorf("%q is not by digest: pin images as repository@sha256:<64 hex digits> or repository:tag@sha256:<64 hex digits>", name)
	}
	image = ref.Name() + "@" + digested.Digest().String()
	if err := ValidateImage(image); err != nil {
		return "", Tag{}, err
	}
	if isTagged {
		tag = Tag{Name: ref.Name() + ":" + tagged.Tag(), Image: image}
	}
	return image, tag, nil
}

// TagsOf are the tags of sets, each once, by name; a tag two sets pin to different
// digests is left out (conflicts says which), since no one digest may answer it.
func TagsOf(sets []Set) (tags []Tag, conflicts []string) {
	by := map[string]Tag{}
	bad := map[string]bool{}
	for _, s := range sets {
		for _, t := range s.Tags {
			if prev, ok := by[t.Name]; ok && prev.Image != t.Image {
				bad[t.Name] = true
				continue
			}
			by[t.Name] = t
		}
	}
	for name, t := range by {
		if bad[name] {
			conflicts = append(conflicts, fmt.Sprintf("tag %s is pinned to different digests by different sets; not pre-loaded", name))
			continue
		}
		tags = append(tags, t)
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i].Name < tags[j].Name })
	sort.Strings(conflicts)
	return tags, conflicts
}
