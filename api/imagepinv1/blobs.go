package imagepinv1

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/imagepin/imagepin/status"
)

// FromBlobs is a node's pinned images' blobs as a report carries them: the whole
// table, its id and the bitmaps; nil when the node says nothing of its blobs.
func FromBlobs(images []status.ImageBlobs) *BlobHoldings {
	if images == nil {
		return nil
	}
	t := &BlobTable{}
	var held, seeded []bool
	for _, img := range images {
		l := &ImageBlobList{Image: img.Image, Sets: img.Sets, Unknown: img.Unknown}
		for _, b := range img.Blobs {
			l.Blobs = append(l.Blobs, &BlobRef{Digest: b.Digest, Size: b.Size})
			held, seeded = append(held, b.Held), append(seeded, b.Seeded)
		}
		t.Images = append(t.Images, l)
	}
	return &BlobHoldings{TableId: TableID(t), Table: t, Held: Bitmap(held), Seeded: Bitmap(seeded)}
}

// TableID is the SHA-256 of a table's canonical encoding: every string and number in
// order, each length-prefixed, so that two tables have one id only when they are equal.
func TableID(t *BlobTable) []byte {
	h := sha256.New()
	num := func(n uint64) {
		var b [binary.MaxVarintLen64]byte
		h.Write(b[:binary.PutUvarint(b[:], n)])
	}
	str := func(s string) {
		num(uint64(len(s)))
		h.Write([]byte(s))
	}
	num(uint64(len(t.GetImages())))
	for _, img := range t.GetImages() {
		str(img.GetImage())
		num(uint64(len(img.GetSets())))
		for _, s := range img.GetSets() {
			str(s)
		}
		str(img.GetUnknown())
		num(uint64(len(img.GetBlobs())))
		for _, b := range img.GetBlobs() {
			str(b.GetDigest())
			num(uint64(b.GetSize()))
		}
	}
	return h.Sum(nil)
}

// Blobs counts the blobs of a table: the bits its bitmaps must have.
func (t *BlobTable) Blobs() int {
	n := 0
	for _, img := range t.GetImages() {
		n += len(img.GetBlobs())
	}
	return n
}

// Bitmap packs bits, bit i in byte i/8 at i%8 (least significant first).
func Bitmap(bits []bool) []byte {
	b := make([]byte, (len(bits)+7)/8)
	for i, on := range bits {
		if on {
			b[i/8] |= 1 << (i % 8)
		}
	}
	return b
}

// Bit is bit i of a bitmap (false past its end).
func Bit(b []byte, i int) bool {
	return i/8 < len(b) && b[i/8]&(1<<(i%8)) != 0
}

// FromHolders is the protocol's form of a count of holders.
func FromHolders(h status.BlobHolders) *BlobHolders {
	p := &BlobHolders{Status: h.Status, Images: uint32(h.Images), Blobs: uint32(h.Blobs), NoHolder: h.NoHolder,
		NoHolderCount: uint32(h.NoHolderCount), ShortCount: uint32(h.ShortCount), Unknown: h.Unknown}
	for _, b := range h.Short {
		p.Short = append(p.Short, &ShortBlob{Digest: b.Digest, Image: b.Image, Size: b.Size, Holders: b.Holders, Seeded: b.Seeded, Pinners: uint32(b.Pinners)})
	}
	return p
}

// ToStatus is the count in the status model; a nil count, or one of another status, is
// Unknown.
func (p *BlobHolders) ToStatus() status.BlobHolders {
	switch p.GetStatus() {
	case status.True, status.False, status.Unknown:
	default:
		return status.HoldersUnknown("the aggregator gave no count")
	}
	h := status.BlobHolders{Status: p.GetStatus(), Images: int(p.GetImages()), Blobs: int(p.GetBlobs()), NoHolder: p.GetNoHolder(),
		NoHolderCount: int(p.GetNoHolderCount()), ShortCount: int(p.GetShortCount()), Unknown: p.GetUnknown()}
	for _, b := range p.GetShort() {
		h.Short = append(h.Short, status.ShortBlob{Digest: b.GetDigest(), Image: b.GetImage(), Size: b.GetSize(), Holders: b.GetHolders(),
			Seeded: b.GetSeeded(), Pinners: int(b.GetPinners())})
	}
	return h
}
