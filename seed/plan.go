package seed

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/imagepin/imagepin/blobstore"
)

// MaxManifest bounds a manifest or an index (the registry's own limit is 4 MiB).
const MaxManifest = 4 << 20

// item is a manifest or a blob to seed.
type item struct {
	Content
	manifest bool
	// path is where the medium has it ("": the medium lacks it, the store has it).
	path string
	// present: the store holds it already (when planned).
	present bool
	// where names it for messages: the image and the chain down to it.
	where string
}

// plan is everything a medium's images need, checked before a byte is written: every
// manifest read and checked against its digest, every blob found in the medium (with
// its descriptor's size) or in the store.
type plan struct {
	layout *layout
	images []Image
	items  map[digest.Digest]*item
	// order is the order of writing: blobs, then manifests each after what it names.
	order []digest.Digest
}

// store is what planning and seeding need of the blob store.
type store interface {
	Size(ctx context.Context, d digest.Digest) (int64, bool)
	Reader(ctx context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error)
	ResumeWriter(ctx context.Context, prefix string, d digest.Digest, size int64) (*blobstore.Writer, int64, error)
	Delete(ctx context.Context, d digest.Digest) error
	ReleaseIngestsOf(ctx context.Context, prefix string) (int, int64, error)
}

// manifestDoc is what a manifest or an index names.
type manifestDoc struct {
	SchemaVersion int                  `json:"schemaVersion"`
	MediaType     string               `json:"mediaType"`
	Config        *ocispec.Descriptor  `json:"config"`
	Layers        []ocispec.Descriptor `json:"layers"`
	Manifests     []ocispec.Descriptor `json:"manifests"`
	FSLayers      []json.RawMessage    `json:"fsLayers"`
}

func (d *manifestDoc) isIndex() bool {
	return d.Manifests != nil || d.MediaType == ocispec.MediaTypeImageIndex ||
		d.MediaType == "application/vnd.docker.distribution.manifest.list.v2+json"
}

func parseManifest(data []byte) (*manifestDoc, error) {
	var doc manifestDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("not a manifest: %v", err)
	}
	if doc.SchemaVersion == 1 || doc.FSLayers != nil {
		return nil, fmt.Errorf("a schema 1 manifest (not supported: its digest is not of its bytes)")
	}
	if doc.SchemaVersion != 2 {
		return nil, fmt.Errorf("schemaVersion %d", doc.SchemaVersion)
	}
	if !doc.isIndex() && doc.Config == nil {
		return nil, fmt.Errorf("a manifest with no config")
	}
	return &doc, nil
}

// makePlan reads the medium's manifests and finds every blob they name.
func makePlan(ctx context.Context, m *media, l *layout, st store) (*plan, error) {
	p := &plan{layout: l, items: map[digest.Digest]*item{}}
	children := map[digest.Digest][]digest.Digest{}
	var visit func(desc ocispec.Descriptor, where string) (*manifestDoc, error)
	visit = func(desc ocispec.Descriptor, where string) (*manifestDoc, error) {
		if it, ok := p.items[desc.Digest]; ok {
			if !it.manifest {
				return nil, badf("%s: %s is named as a manifest and as a blob", where, desc.Digest)
			}
			return nil, nil
		}
		it := &item{Content: Content{Digest: desc.Digest, Size: desc.Size, MediaType: desc.MediaType}, manifest: true, where: where}
		data, err := p.readManifest(ctx, m, st, it)
		if err != nil {
			return nil, err
		}
		doc, err := parseManifest(data)
		if err != nil {
			return nil, badf("%s: %s: %v", where, it.Digest, err)
		}
		if it.MediaType == "" {
			it.MediaType = doc.MediaType
		}
		p.items[it.Digest] = it
		var kids []ocispec.Descriptor
		if doc.Config != nil {
			kids = append(kids, *doc.Config)
		}
		kids = append(kids, doc.Layers...)
		for i, c := range kids {
			cw := fmt.Sprintf("%s → %s blob %d (%s)", where, it.Digest, i, c.Digest)
			if err := p.addBlob(ctx, m, st, c, cw); err != nil {
				return nil, err
			}
		}
		for i, c := range doc.Manifests {
			cw := fmt.Sprintf("%s → %s manifests[%d]", where, it.Digest, i)
			if err := checkDesc(c); err != nil {
				return nil, badf("%s: %v", cw, err)
			}
			children[it.Digest] = append(children[it.Digest], c.Digest)
			if _, err := visit(c, cw); err != nil {
				return nil, err
			}
		}
		p.order = append(p.order, it.Digest) // after its children
		return doc, nil
	}
	var untagged []root
	for _, r := range l.roots {
		doc, err := visit(r.desc, m.path+": "+r.where)
		if err != nil {
			return nil, err
		}
		it := p.items[r.desc.Digest]
		img := r.image
		img.Size, img.MediaType = it.Size, it.MediaType
		if doc == nil && r.desc.MediaType != "" {
			img.MediaType = r.desc.MediaType
		}
		if r.untagged {
			untagged = append(untagged, root{image: img, where: r.where})
			continue
		}
		p.images = append(p.images, img)
	}
	// A registry's revision that another manifest names (an index's child) is no image
	// of its own.
	named := map[digest.Digest]bool{}
	for _, kids := range children {
		for _, k := range kids {
			named[k] = true
		}
	}
	for _, r := range untagged {
		if !named[r.image.Digest] {
			p.images = append(p.images, r.image)
		}
	}
	// Blobs first, manifests after (p.order holds them each after its children).
	var blobs []digest.Digest
	for d, it := range p.items {
		if !it.manifest {
			blobs = append(blobs, d)
		}
	}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i] < blobs[j] })
	p.order = append(blobs, p.order...)
	return p, nil
}

func checkDesc(c ocispec.Descriptor) error {
	if err := c.Digest.Validate(); err != nil {
		return fmt.Errorf("digest %q: %v", c.Digest, err)
	}
	if c.Size < 0 {
		return fmt.Errorf("%s: size %d", c.Digest, c.Size)
	}
	return nil
}

// locate finds it in the medium (its size the descriptor's) or in the store.
func (p *plan) locate(ctx context.Context, m *media, st store, it *item) error {
	name := p.layout.blob(it.Digest)
	if e, ok := m.entries[name]; ok {
		if it.Size >= 0 && e.size != it.Size {
			return badf("%s: %s is %d bytes, its descriptor says %d", it.where, name, e.size, it.Size)
		}
		it.Size, it.path = e.size, name
	}
	if size, ok := st.Size(ctx, it.Digest); ok && (it.Size < 0 || size == it.Size) {
		it.Size, it.present = size, true
	}
	if it.path == "" && !it.present {
		return badf("%s: %s is missing (no %s in the medium, not in the store)", it.where, it.Digest, name)
	}
	return nil
}

// readManifest reads and checks a manifest, from the medium or else the store.
func (p *plan) readManifest(ctx context.Context, m *media, st store, it *item) ([]byte, error) {
	if err := p.locate(ctx, m, st, it); err != nil {
		return nil, err
	}
	if it.Size > MaxManifest {
		return nil, badf("%s: manifest %s is %d bytes, more than %d", it.where, it.Digest, it.Size, MaxManifest)
	}
	var rd io.ReadSeekCloser
	var err error
	if it.path != "" {
		rd, _, err = m.open(it.path)
	} else {
		rd, _, err = st.Reader(ctx, it.Digest)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", it.where, err)
	}
	defer rd.Close()
	data, err := io.ReadAll(io.LimitReader(rd, it.Size+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", it.where, err)
	}
	if int64(len(data)) != it.Size {
		return nil, badf("%s: manifest %s: read %d bytes, want %d", it.where, it.Digest, len(data), it.Size)
	}
	if got := it.Digest.Algorithm().FromBytes(data); got != it.Digest {
		return nil, badf("%s: %s holds bytes of digest %s, not %s", it.where, it.path, got, it.Digest)
	}
	return data, nil
}

func (p *plan) addBlob(ctx context.Context, m *media, st store, c ocispec.Descriptor, where string) error {
	if err := checkDesc(c); err != nil {
		return badf("%s: %v", where, err)
	}
	if it, ok := p.items[c.Digest]; ok {
		if it.manifest {
			return badf("%s: %s is named as a blob and as a manifest", where, c.Digest)
		}
		if it.Size != c.Size {
			return badf("%s: %s is named with sizes %d and %d", where, c.Digest, it.Size, c.Size)
		}
		return nil
	}
	it := &item{Content: Content{Digest: c.Digest, Size: c.Size, MediaType: c.MediaType}, where: where}
	if err := p.locate(ctx, m, st, it); err != nil {
		if len(c.URLs) > 0 {
			return nil // a foreign layer: the runtime fetches it from its URLs
		}
		return err
	}
	p.items[c.Digest] = it
	return nil
}

// need are the bytes the store lacks, and the bytes and count it holds already.
func (p *plan) need() (need, present int64, presentN int) {
	for _, it := range p.items {
		if it.present {
			present += it.Size
			presentN++
		} else {
			need += it.Size
		}
	}
	return need, present, presentN
}

// record is the plan as a seed's record.
func (p *plan) record(m *media) *Record {
	r := &Record{Version: RecordVersion, ID: recordID(p.images), Images: p.images}
	for _, d := range p.order {
		it := p.items[d]
		if it.manifest {
			r.Manifests = append(r.Manifests, it.Content)
		} else {
			r.Blobs = append(r.Blobs, it.Content)
		}
		r.Bytes += it.Size
	}
	return r
}
