package aggregator

import (
	"bytes"
	"fmt"
	"slices"
	"unique"

	"github.com/opencontainers/go-digest"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
)

// Bounds of a node's table of blobs: images (each set at most 2,000, a node's sets
// together far fewer) and blobs (a manifest, a config and layers: an image's layers are
// at most 127 in most runtimes, an index adds a manifest).
const (
	maxTableImages   = 20000
	maxBlobsPerImage = 1024
)

// blobTable is a node's table of its pinned images' blobs (BlobTable), kept once for
// every node reporting the same one: thousands of nodes pinning the same sets on one
// platform report the same table, and each keeps only its bitmaps.
type blobTable struct {
	id     string
	images []tableImage
	bits   int
	// refs counts the nodes whose last report names it; at 0 it is dropped.
	refs int
}

// tableImage is one image of a table; its blobs are bits first … first+len(blobs)-1.
type tableImage struct {
	image   string
	sets    []string
	unknown string
	first   int
	blobs   []tableBlob
}

type tableBlob struct {
	digest string
	size   int64
}

// nodeBlobs is what a node's last report says of its blobs.
type nodeBlobs struct {
	tableID string
	// table is nil while the store lacks it (the node is asked for it).
	table        *blobTable
	held, seeded []byte
}

// parseBlobs checks a report's blobs and turns its table, when it carries one, into a
// blobTable (not yet kept): outside the store's lock.
func (s *Store) parseBlobs(b *v1.BlobHoldings) (*blobTable, error) {
	if b == nil {
		return nil, nil
	}
	if len(b.GetTableId()) != 32 {
		return nil, fmt.Errorf("%w: blobs.table_id must be 32 bytes", ErrInvalid)
	}
	t := b.GetTable()
	if t == nil {
		return nil, nil
	}
	if !bytes.Equal(v1.TableID(t), b.GetTableId()) {
		return nil, fmt.Errorf("%w: blobs.table_id is not the table's", ErrInvalid)
	}
	if len(t.GetImages()) > maxTableImages {
		return nil, fmt.Errorf("%w: blobs.table: %d images, at most %d", ErrInvalid, len(t.GetImages()), maxTableImages)
	}
	bt := &blobTable{id: string(b.GetTableId())}
	long := func(v string) bool { return len(v) > s.limits.MaxStringLength }
	for i, img := range t.GetImages() {
		if img.GetImage() == "" || long(img.GetImage()) || long(img.GetUnknown()) || len(img.GetSets()) > s.limits.MaxSetsPerReport {
			return nil, fmt.Errorf("%w: blobs.table.images[%d]: an empty or too long image, reason or set list", ErrInvalid, i)
		}
		if i > 0 && img.GetImage() <= t.GetImages()[i-1].GetImage() {
			return nil, fmt.Errorf("%w: blobs.table.images[%d] %q: images must be sorted, each once", ErrInvalid, i, img.GetImage())
		}
		if len(img.GetBlobs()) > maxBlobsPerImage {
			return nil, fmt.Errorf("%w: blobs.table.images[%d] %q: %d blobs, at most %d", ErrInvalid, i, img.GetImage(), len(img.GetBlobs()), maxBlobsPerImage)
		}
		ti := tableImage{image: unique.Make(img.GetImage()).Value(), unknown: img.GetUnknown(), first: bt.bits}
		for _, set := range img.GetSets() {
			if long(set) {
				return nil, fmt.Errorf("%w: blobs.table.images[%d]: a set name longer than %d bytes", ErrInvalid, i, s.limits.MaxStringLength)
			}
			ti.sets = append(ti.sets, unique.Make(set).Value())
		}
		for j, blob := range img.GetBlobs() {
			if _, err := digest.Parse(blob.GetDigest()); err != nil || blob.GetSize() < 0 {
				return nil, fmt.Errorf("%w: blobs.table.images[%d].blobs[%d] %q: not a digest with a size", ErrInvalid, i, j, blob.GetDigest())
			}
			ti.blobs = append(ti.blobs, tableBlob{digest: unique.Make(blob.GetDigest()).Value(), size: blob.GetSize()})
		}
		bt.bits += len(ti.blobs)
		bt.images = append(bt.images, ti)
	}
	return bt, nil
}

// resolveBlobs is the node's blobs from a checked report: its table the one the store
// keeps under that id, else parsed, else none (want: ask the node for it). Called with
// the lock held; it changes nothing, so a report refused here changes nothing.
func (s *Store) resolveBlobs(b *v1.BlobHoldings, parsed *blobTable) (nb *nodeBlobs, want bool, err error) {
	if b == nil {
		return nil, false, nil
	}
	nb = &nodeBlobs{tableID: string(b.GetTableId()), held: slices.Clone(b.GetHeld()), seeded: slices.Clone(b.GetSeeded())}
	nb.table = s.tables[nb.tableID]
	if nb.table == nil {
		nb.table = parsed
	}
	if nb.table == nil {
		return nb, true, nil
	}
	size := (nb.table.bits + 7) / 8
	if len(nb.held) != size || len(nb.seeded) != size {
		return nil, false, fmt.Errorf("%w: blobs.held and blobs.seeded must be %d bytes for the table's %d blobs", ErrInvalid, size, nb.table.bits)
	}
	return nb, false, nil
}

// keepBlobs makes nb the node's blobs, keeping its table and letting go of the old one.
// Called with the lock held.
func (s *Store) keepBlobs(e *nodeEntry, nb *nodeBlobs) {
	s.dropBlobs(e)
	if nb != nil && nb.table != nil {
		if s.tables == nil {
			s.tables = map[string]*blobTable{}
		}
		s.tables[nb.table.id] = nb.table
		nb.table.refs++
	}
	e.blobs = nb
}

// dropBlobs lets go of the node's table (the node forgotten, or reporting another one).
func (s *Store) dropBlobs(e *nodeEntry) {
	if e.blobs != nil && e.blobs.table != nil {
		t := e.blobs.table
		if t.refs--; t.refs <= 0 {
			delete(s.tables, t.id)
		}
	}
	e.blobs = nil
}
