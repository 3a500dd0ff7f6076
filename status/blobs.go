package status

import (
	"fmt"
	"strings"

	"github.com/imagepin/imagepin/internal/bytesize"
)

// MinBlobHolders is how many holders every blob of a set's images needs before the set
// counts as registry independent. A node that joins, or replaces one, with the registry
// gone gets every blob from its peers' stores; with two holders the loss of any one node
// still leaves one. A holder is a node whose store holds the blob and serves it to peers
// (it pins the image); a blob a node holds from a seed counts once more, for the medium
// it came from, which can seed a replacement. docs/registry-gone.md says why two.
const MinBlobHolders = 2

// ImageBlobs is one image a node pins: the digests of its blobs as this node's platform
// names them (its manifests, config and layers), and which of them the node holds for
// its peers. The node reports them to the aggregator, which counts the holders of each
// blob across the cluster; they are not part of the status file.
type ImageBlobs struct {
	// Image is the pinned reference (repo@sha256:…).
	Image string
	// Sets are the node's sets that pin it, sorted.
	Sets []string
	// Blobs are its blobs, by digest; nil when not known (Unknown says why).
	Blobs   []Blob
	Unknown string
}

// Blob is one blob of a pinned image on a node.
type Blob struct {
	Digest string
	// Size is the descriptor's; 0 when the node does not know it (a pinned manifest it
	// does not hold yet).
	Size int64
	// Held: the node's store (on containerd, its content store) holds it and serves it
	// to peers. Seeded: a seed on the node names it.
	Held, Seeded bool
}

// BlobHolders is the cluster's answer, from the aggregator, to "does every blob of
// these images have at least MinBlobHolders holders?", for a set or a list of images.
type BlobHolders struct {
	// Status is True (every blob has enough holders), False (Short names some that do
	// not, for sure) or Unknown (Unknown says why it cannot be told).
	Status string `json:"status"`
	// Images and Blobs are what was counted.
	Images int `json:"images"`
	Blobs  int `json:"blobs"`
	// NoHolder are the first images no node that shares its blobs pins (their blobs
	// are not even known); NoHolderCount counts them all.
	NoHolder      []string `json:"noHolder,omitempty"`
	NoHolderCount int      `json:"noHolderCount,omitempty"`
	// Short are the first blobs with fewer than MinBlobHolders holders, fewest first;
	// ShortCount counts them all.
	Short      []ShortBlob `json:"short,omitempty"`
	ShortCount int         `json:"shortCount,omitempty"`
	// Unknown says why some blobs' holders cannot be counted ("" when they can).
	Unknown string `json:"unknown,omitempty"`
}

// ShortBlob is a blob with fewer than MinBlobHolders holders.
type ShortBlob struct {
	Digest string `json:"digest"`
	// Image is an image it belongs to (the first by name).
	Image string `json:"image"`
	Size  int64  `json:"size"`
	// Holders are the nodes whose store holds it (the first few); Seeded says a seed
	// holds it too (its medium counts as one more holder).
	Holders []string `json:"holders,omitempty"`
	Seeded  bool     `json:"seeded,omitempty"`
	// Pinners are the live nodes that pin its image: each of them, replaced, needs it.
	Pinners int `json:"pinners"`
}

// MaxShortNamed bounds the short blobs an answer names.
const MaxShortNamed = 5

// HoldersUnknown is the answer when there is none to be had, saying why.
func HoldersUnknown(why string) BlobHolders {
	return BlobHolders{Status: Unknown, Unknown: why}
}

// Count is how many holders the blob has: its nodes, and its seed's medium.
func (b ShortBlob) Count() int {
	n := len(b.Holders)
	if b.Seeded {
		n++
	}
	return n
}

// Why says in one line what stands in the way ("" when Status is True): the blobs with
// too few holders, each with its image, size and holders, and which nodes would then
// fail to join (the words of RegistryIndependent, on the node and for the set).
func (h BlobHolders) Why() string {
	var parts []string
	if h.NoHolderCount > 0 {
		line := fmt.Sprintf("%d of the %d images are pinned by no node that shares its blobs ([peers] on), so a node joining or replacing one would find none of their blobs: %s",
			h.NoHolderCount, h.Images, strings.Join(h.NoHolder, ", "))
		if more := h.NoHolderCount - len(h.NoHolder); more > 0 {
			line += fmt.Sprintf(" and %d more", more)
		}
		parts = append(parts, line)
	}
	if h.ShortCount > 0 {
		var each []string
		for _, b := range h.Short {
			each = append(each, b.describe())
		}
		line := fmt.Sprintf("%d of the %d blobs of the images are held by fewer than %d nodes (with the registry gone, a node joining or replacing one gets every blob from its peers): %s",
			h.ShortCount, h.Blobs, MinBlobHolders, strings.Join(each, "; "))
		if more := h.ShortCount - len(h.Short); more > 0 {
			line += fmt.Sprintf("; and %d more", more)
		}
		parts = append(parts, line)
	}
	if h.Unknown != "" {
		parts = append(parts, fmt.Sprintf("whether every blob of the images is held by %d nodes cannot be told: %s", MinBlobHolders, h.Unknown))
	}
	if len(parts) == 0 && h.Status != True {
		parts = append(parts, fmt.Sprintf("whether every blob of the images is held by %d nodes cannot be told", MinBlobHolders))
	}
	return strings.Join(parts, "; ")
}

// describe names the blob, its image and size, who holds it, and who would fail.
func (b ShortBlob) describe() string {
	what := fmt.Sprintf("%s (%s, of %s)", b.Digest, bytesize.Human(uint64(max(b.Size, 0))), b.Image)
	holders := strings.Join(b.Holders, ", ")
	switch {
	case b.Count() == 0:
		return fmt.Sprintf("%s is held by no node: any node joining, or replacing one of the %d that pin the image, would fail", what, b.Pinners)
	case len(b.Holders) == 0:
		return fmt.Sprintf("%s is held by a seed's medium only: a node joining would fail unless the medium is seeded on it", what)
	case b.Seeded:
		return fmt.Sprintf("%s is held by %s and its seed's medium only: a node replacing %s would fail unless the medium is seeded on it", what, holders, holders)
	}
	return fmt.Sprintf("%s is held by %s only: a node replacing %s would fail, and any node joining once %s is gone", what, holders, holders, holders)
}
