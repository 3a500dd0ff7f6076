package seed

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Formats of media, as records and messages name them.
const (
	FormatOCI          = "oci-layout"
	FormatDistribution = "registry-storage"
)

// AnnotationContainerdName is containerd's full image name on an index.json entry
// (ctr export, docker save from Docker 25 on); ocispec.AnnotationRefName is the OCI
// name, which skopeo (oci:DIR:NAME) and podman save write as given (a tag, or a full
// name), crane pull --annotate-ref as the full name, containerd as the tag alone.
const AnnotationContainerdName = "io.containerd.image.name"

// maxIndexFile bounds index.json and a registry's link files.
const (
	maxIndexFile = 4 << 20
	maxLinkFile  = 1 << 10
)

// root is an image the medium names: a manifest or an index, with its names.
type root struct {
	desc ocispec.Descriptor // Size -1: the medium gives none (the blob's own size)
	// where names it in the medium, for messages.
	where string
	image Image
	// untagged: a registry's revision no tag names, an image by digest unless another
	// manifest of its repository names it (then it is that one's child, not an image).
	untagged bool
}

// layout is a medium read as one of the formats: its images and where its blobs are.
type layout struct {
	format string
	roots  []root
	blob   func(d digest.Digest) string
}

// Names is what the media cannot say: the repository of an OCI layout whose names are
// tags only, and the registry host of a registry's storage (whose repositories carry
// none).
type Names struct {
	// Repository names the images of an OCI layout named by a tag alone
	// ("quay.io/ns/app").
	Repository string
	// Registry is the host a registry storage's repositories came from ("quay.io").
	Registry string
}

// readLayout finds the medium's format and its images.
func readLayout(m *media, names Names) (*layout, error) {
	if m.refused != nil && !isDockerArchive(m) {
		return nil, m.refused
	}
	switch {
	case m.has(ociLayoutFile) || m.has(ociIndexFile):
		return readOCI(m, names)
	case m.hasDir(distRoot + "repositories/"):
		return readDistribution(m, distRoot, names)
	case m.hasDir("repositories/") && m.hasDir("blobs/"):
		return readDistribution(m, "", names)
	case isDockerArchive(m):
		return nil, badf("%s is a docker-archive (docker save): it holds layers as the daemon keeps them, not the registry's blobs, "+
			"so its digests are not the ones pins name. Seed from the registry's own bytes instead: skopeo copy --all --preserve-digests docker://REGISTRY/REPO@DIGEST oci-archive:FILE.tar:REGISTRY/REPO:TAG "+
			"(or, keeping this archive's digests, skopeo copy docker-archive:%s oci-archive:FILE.tar:REGISTRY/REPO:TAG)", m.path, m.path)
	}
	return nil, badf("%s: no oci-layout and index.json, no docker/registry/v2/repositories: not a medium to seed from", m.path)
}

// isDockerArchive: docker save's manifest.json, and no OCI layout beside it (Docker 25
// on writes both: then it is read as the layout).
func isDockerArchive(m *media) bool {
	return m.has("manifest.json") && !m.has(ociLayoutFile)
}

func readOCI(m *media, names Names) (*layout, error) {
	raw, err := m.readSmall(ociLayoutFile, maxLinkFile)
	if err != nil {
		return nil, badf("%s: %s: %v (an OCI image layout has one)", m.path, ociLayoutFile, err)
	}
	var ol ocispec.ImageLayout
	if err := json.Unmarshal(raw, &ol); err != nil || ol.Version == "" {
		return nil, badf("%s: %s: not an OCI layout file (%q)", m.path, ociLayoutFile, raw)
	}
	if !strings.HasPrefix(ol.Version, "1.") {
		return nil, badf("%s: %s: image layout version %q (this reads 1.x)", m.path, ociLayoutFile, ol.Version)
	}
	raw, err = m.readSmall(ociIndexFile, maxIndexFile)
	if err != nil {
		return nil, badf("%s: %s: %v", m.path, ociIndexFile, err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, badf("%s: %s: %v", m.path, ociIndexFile, err)
	}
	if len(idx.Manifests) == 0 {
		return nil, badf("%s: %s names no image", m.path, ociIndexFile)
	}
	l := &layout{format: FormatOCI, blob: func(d digest.Digest) string {
		return "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
	}}
	for i, desc := range idx.Manifests {
		where := fmt.Sprintf("%s manifests[%d]", ociIndexFile, i)
		if err := desc.Digest.Validate(); err != nil {
			return nil, badf("%s: %s: digest %q: %v", m.path, where, desc.Digest, err)
		}
		if desc.Size <= 0 {
			return nil, badf("%s: %s: size %d", m.path, where, desc.Size)
		}
		img, err := ociImage(desc, names)
		if err != nil {
			return nil, badf("%s: %s: %v", m.path, where, err)
		}
		l.roots = append(l.roots, root{desc: desc, where: where, image: img})
	}
	return l, nil
}

// tagRE is the grammar of a tag (distribution's reference.TagRegexp, anchored).
var tagRE = regexp.MustCompile(`^[\w][\w.-]{0,127}$`)

// ociImage names an index.json entry: containerd's full name first, else the OCI name:
// a full reference ("quay.io/ns/app:v1", "alpine:3" as docker names it), or a tag
// alone, whose repository is names.Repository ("" when not given). No name: an image
// by digest.
func ociImage(desc ocispec.Descriptor, names Names) (Image, error) {
	img := Image{Digest: desc.Digest}
	n := desc.Annotations[AnnotationContainerdName]
	if n == "" {
		n = desc.Annotations[ocispec.AnnotationRefName]
		if n != "" && tagRE.MatchString(n) {
			img.MediaName, img.Tag, img.Repository = n, n, names.Repository
			return img, nil
		}
	}
	if n == "" {
		return img, nil
	}
	img.MediaName = n
	ref, err := reference.ParseNormalizedNamed(n)
	if err != nil {
		return img, fmt.Errorf("name %q is neither a tag nor an image reference: %v", n, err)
	}
	img.Repository = ref.Name()
	if t, ok := ref.(reference.Tagged); ok {
		img.Tag = t.Tag()
	}
	if c, ok := ref.(reference.Digested); ok && c.Digest() != desc.Digest {
		return img, fmt.Errorf("name %q names digest %s, the entry %s", n, c.Digest(), desc.Digest)
	}
	return img, nil
}

// readDistribution reads the storage of a distribution registry under pre: each
// repository's tags (_manifests/tags/<tag>/current/link) and revisions
// (_manifests/revisions/<alg>/<hex>/link); blobs under blobs/<alg>/<hex[:2]>/<hex>/data.
func readDistribution(m *media, pre string, names Names) (*layout, error) {
	l := &layout{format: FormatDistribution, blob: func(d digest.Digest) string {
		e := d.Encoded()
		return pre + "blobs/" + d.Algorithm().String() + "/" + e[:2] + "/" + e + "/data"
	}}
	if names.Registry != "" {
		if _, err := reference.ParseNormalizedNamed(names.Registry + "/x"); err != nil || strings.Contains(names.Registry, "/") {
			return nil, fmt.Errorf("registry %q: not a registry host", names.Registry)
		}
	}
	repos := pre + "repositories/"
	tagged := map[string]bool{}
	var revisions []root
	for _, name := range m.under(repos) {
		rest := strings.TrimPrefix(name, repos)
		repo, sub, ok := strings.Cut(rest, "/_manifests/")
		if !ok || !strings.HasSuffix(sub, "/link") {
			continue // _layers, _uploads: what the manifests name is what counts
		}
		parts := strings.Split(strings.TrimSuffix(sub, "/link"), "/")
		isTag := len(parts) == 3 && parts[0] == "tags" && parts[2] == "current"
		isRev := len(parts) == 3 && parts[0] == "revisions"
		if !isTag && !isRev {
			continue // tags/<tag>/index/...: a tag's history
		}
		if _, err := reference.ParseNormalizedNamed(repo); err != nil || strings.ContainsAny(repo, ":@") {
			return nil, badf("%s: %s: repository %q: not a repository name", m.path, name, repo)
		}
		raw, err := m.readSmall(name, maxLinkFile)
		if err != nil {
			return nil, badf("%s: %s: %v", m.path, name, err)
		}
		d, err := digest.Parse(strings.TrimSpace(string(raw)))
		if err != nil {
			return nil, badf("%s: %s: %q is not a digest", m.path, name, raw)
		}
		img := Image{Digest: d, MediaName: repo}
		if names.Registry != "" {
			img.Repository = names.Registry + "/" + repo
		}
		r := root{desc: ocispec.Descriptor{Digest: d, Size: -1}, where: name}
		if isTag {
			if !tagRE.MatchString(parts[1]) {
				return nil, badf("%s: %s: tag %q: not a tag", m.path, name, parts[1])
			}
			img.Tag = parts[1]
			img.MediaName = repo + ":" + parts[1]
			r.image = img
			l.roots = append(l.roots, r)
			tagged[repo+"@"+d.String()] = true
			continue
		}
		if want := digest.NewDigestFromEncoded(digest.Algorithm(parts[1]), parts[2]); want != d {
			return nil, badf("%s: %s: links %s", m.path, name, d)
		}
		r.image, r.untagged = img, true
		revisions = append(revisions, r)
	}
	for _, r := range revisions {
		if !tagged[r.image.MediaName+"@"+r.desc.Digest.String()] {
			l.roots = append(l.roots, r)
		}
	}
	if len(l.roots) == 0 {
		return nil, badf("%s: %s holds no manifest", m.path, repos)
	}
	sort.SliceStable(l.roots, func(i, j int) bool { return l.roots[i].where < l.roots[j].where })
	return l, nil
}
