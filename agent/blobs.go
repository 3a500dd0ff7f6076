package agent

import (
	"slices"
	"sort"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
)

// BlobHoldings is what the agent needs of the node's blob store ([peers]): for a pinned
// image, the digests of its blobs (manifests, config, layers, as this node's platform
// names them) and which of them the node holds for its peers. It is asked at every
// pass, for every pinned image: it answers from memory.
type BlobHoldings interface {
	// ImageBlobs is image's blobs; why says why they are not known ("" when they are:
	// its manifest not read yet, say).
	ImageBlobs(image string) (blobs []status.Blob, why string)
}

// HolderCounts is the cluster's count of the holders of every blob of a set's images
// (the aggregator's answer to the node's reports, report.Reporter.Holders): Unknown,
// saying why, when there is none to be had.
type HolderCounts interface {
	Holders(set string) status.BlobHolders
}

// noStore is why a node without Deps.Blobs says nothing of its blobs.
const noStore = "the node holds no blob for its peers ([peers] is off)"

// imageBlobs are the desired sets' images with their blobs, each image once with the
// sets that pin it, for the aggregator's count of holders (status.Node.Blobs).
func (a *Agent) imageBlobs(desired []pinset.Set) []status.ImageBlobs {
	sets := map[string][]string{}
	for _, s := range desired {
		for _, img := range s.Images {
			sets[img] = append(sets[img], s.Name)
		}
	}
	out := make([]status.ImageBlobs, 0, len(sets))
	for img, names := range sets {
		sort.Strings(names)
		ib := status.ImageBlobs{Image: img, Sets: slices.Compact(names), Unknown: noStore}
		if a.deps.Blobs != nil {
			ib.Blobs, ib.Unknown = a.deps.Blobs.ImageBlobs(img)
			ib.Blobs = byDigest(ib.Blobs)
		}
		out = append(out, ib)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Image < out[j].Image })
	return out
}

// byDigest sorts blobs by digest, each once (held if any copy says so).
func byDigest(blobs []status.Blob) []status.Blob {
	blobs = slices.Clone(blobs)
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].Digest < blobs[j].Digest })
	out := blobs[:0]
	for _, b := range blobs {
		if n := len(out); n > 0 && out[n-1].Digest == b.Digest {
			out[n-1].Held = out[n-1].Held || b.Held
			out[n-1].Seeded = out[n-1].Seeded || b.Seeded
			continue
		}
		out = append(out, b)
	}
	return out
}

// blobHolders is the aggregator's count for set, or Unknown without an aggregator.
func (a *Agent) blobHolders(set string) status.BlobHolders {
	if a.deps.Holders == nil {
		why := "no aggregator counts them ([report] aggregator is not set)"
		if a.deps.Blobs == nil {
			why += ", and this node shares none ([peers] is off): a node joining, or replacing this one, would need the registry"
		}
		return status.HoldersUnknown(why)
	}
	return a.deps.Holders.Holders(set)
}
