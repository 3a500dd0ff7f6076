package aggregator

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
)

// HoldersFreshness is how old the count of who holds which blob may be when a report is
// answered or a set viewed: counting walks every node's bitmaps (a few milliseconds at
// thousands of nodes), so it is done at most once in this time, not at every report.
const HoldersFreshness = time.Second

// HoldersWarmup is how long after the aggregator starts a blob found with too few
// holders is not yet a sure answer: nodes that hold it may not have reported since
// (two heartbeats at the default).
const HoldersWarmup = 2 * DefaultHeartbeat

// maxNamedNodes bounds the nodes one line names.
const maxNamedNodes = 5

// holdCache keeps the last count.
type holdCache struct {
	every time.Duration
	mu    sync.Mutex
	idx   *holdIndex
}

// holdIndex is who holds which blob of which image across the live nodes, counted from
// their last reports. A holder is a node that shares blobs ([peers], a peer address)
// and whose store holds the blob: it pins the image, so its peers may ask it for it. A
// node that went silent is no holder: it may be the node that was lost.
type holdIndex struct {
	at     time.Time
	images map[string]*imageHold
	// sets are the images each set has on the nodes that report it.
	sets map[string]map[string]bool
	// unsure are the live nodes that share blobs but say nothing of what they hold
	// (an older imagepind, a report restored after a restart, a table asked for): any
	// blob may be theirs.
	unsure []string
	// warming is how long the aggregator has still to wait for nodes to report (0: none).
	warming time.Duration
}

// imageHold is one image across the cluster.
type imageHold struct {
	// unsure counts the nodes that share and pin it but do not know its blobs yet (its
	// manifest not read); unsureWhy is one of their reasons.
	unsure    int
	unsureWhy string
	blobs     map[string]*blobHold
}

// blobHold is one blob of one image: a node holds it for a peer only when it pins that
// image (the peer's request names the image's manifests).
type blobHold struct {
	digest  string
	size    int64
	count   int
	holders []string
	seeded  bool
	// pinners are the live nodes whose table names it: each needs it to be replaced.
	pinners int
}

func (b *blobHold) holding() int {
	n := b.count
	if b.seeded {
		n++
	}
	return n
}

// tableTally sums the nodes reporting one table.
type tableTally struct {
	nodes   int
	count   []int32
	holders [][]string
	seeded  []bool
	sharers int
}

// holdersIndex is the count, made again when older than the cache's freshness. The
// caller must not hold the store's lock.
func (s *Store) holdersIndex() *holdIndex {
	c := &s.holders
	c.mu.Lock()
	defer c.mu.Unlock()
	now := s.now()
	if c.idx != nil && now.Sub(c.idx.at) < c.every {
		return c.idx
	}
	s.mu.RLock()
	c.idx = s.countHolders(now)
	s.mu.RUnlock()
	return c.idx
}

// countHolders counts every live node's blobs: the bitmaps of the nodes sharing one
// table are summed first (a few tables for thousands of nodes), then the tables merged
// by image and digest. Called with the lock held for reading.
func (s *Store) countHolders(now time.Time) *holdIndex {
	idx := &holdIndex{at: now, images: map[string]*imageHold{}, sets: map[string]map[string]bool{}}
	if up := now.Sub(s.started); up < HoldersWarmup {
		idx.warming = HoldersWarmup - up
	}
	tallies := map[*blobTable]*tableTally{}
	for _, e := range s.nodes {
		if e.unknown(now) {
			continue
		}
		sharer := peerAddress(e) != ""
		if e.blobs == nil || e.blobs.table == nil {
			if sharer {
				idx.unsure = append(idx.unsure, e.name)
			}
			continue
		}
		t := e.blobs.table
		ty := tallies[t]
		if ty == nil {
			ty = &tableTally{count: make([]int32, t.bits), holders: make([][]string, t.bits), seeded: make([]bool, t.bits)}
			tallies[t] = ty
		}
		ty.nodes++
		if !sharer {
			continue
		}
		ty.sharers++
		eachBit(e.blobs.held, func(i int) {
			ty.count[i]++
			if len(ty.holders[i]) < status.MinBlobHolders {
				ty.holders[i] = append(ty.holders[i], e.name)
			}
		})
		eachBit(e.blobs.seeded, func(i int) { ty.seeded[i] = true })
	}
	sort.Strings(idx.unsure)
	for t, ty := range tallies {
		for _, im := range t.images {
			ih := idx.images[im.image]
			if ih == nil {
				ih = &imageHold{blobs: map[string]*blobHold{}}
				idx.images[im.image] = ih
			}
			for _, set := range im.sets {
				if idx.sets[set] == nil {
					idx.sets[set] = map[string]bool{}
				}
				idx.sets[set][im.image] = true
			}
			if im.unknown != "" && ty.sharers > 0 {
				ih.unsure += ty.sharers
				if ih.unsureWhy == "" || im.unknown < ih.unsureWhy {
					ih.unsureWhy = im.unknown
				}
			}
			for j, b := range im.blobs {
				i := im.first + j
				bh := ih.blobs[b.digest]
				if bh == nil {
					bh = &blobHold{digest: b.digest, size: b.size}
					ih.blobs[b.digest] = bh
				}
				bh.pinners += ty.nodes
				bh.count += int(ty.count[i])
				bh.holders = append(bh.holders, ty.holders[i]...)
				bh.seeded = bh.seeded || ty.seeded[i]
			}
		}
	}
	return idx
}

// eachBit calls fn with the index of every bit set in b.
func eachBit(b []byte, fn func(int)) {
	for i, x := range b {
		for x != 0 {
			fn(i*8 + bits.TrailingZeros8(x))
			x &= x - 1
		}
	}
}

// answer is the count for images: False when a blob has fewer than MinBlobHolders
// holders even if every node that cannot say held it, or an image is pinned by no node
// that shares; Unknown when that cannot be told; else True.
func (idx *holdIndex) answer(images []string) status.BlobHolders {
	images = slices.Clone(images)
	slices.Sort(images)
	images = slices.Compact(images)
	h := status.BlobHolders{Images: len(images)}
	var short []status.ShortBlob
	maybe, unknownImages := 0, 0
	var unknownWhy string
	for _, img := range images {
		ih := idx.images[img]
		unsure := len(idx.unsure)
		if ih != nil {
			unsure += ih.unsure
			if ih.unsure > 0 && (unknownWhy == "" || ih.unsureWhy < unknownWhy) {
				unknownWhy = ih.unsureWhy
			}
		}
		if ih == nil || len(ih.blobs) == 0 {
			if unsure > 0 || idx.warming > 0 {
				unknownImages++
				continue
			}
			h.NoHolderCount++
			if len(h.NoHolder) < status.MaxShortNamed {
				h.NoHolder = append(h.NoHolder, img)
			}
			continue
		}
		h.Blobs += len(ih.blobs)
		for _, b := range ih.blobs {
			n := b.holding()
			switch {
			case n >= status.MinBlobHolders:
			case n+unsure >= status.MinBlobHolders || idx.warming > 0:
				maybe++
			default:
				holders := slices.Clone(b.holders)
				slices.Sort(holders)
				short = append(short, status.ShortBlob{Digest: b.digest, Image: img, Size: b.size, Holders: holders, Seeded: b.seeded, Pinners: b.pinners})
			}
		}
	}
	sort.Slice(short, func(i, j int) bool {
		a, b := short[i], short[j]
		if a.Count() != b.Count() {
			return a.Count() < b.Count()
		}
		if a.Image != b.Image {
			return a.Image < b.Image
		}
		return a.Digest < b.Digest
	})
	h.ShortCount = len(short)
	h.Short = short[:min(len(short), status.MaxShortNamed)]

	var unknown []string
	if idx.warming > 0 && (maybe > 0 || unknownImages > 0) {
		unknown = append(unknown, fmt.Sprintf("the aggregator started less than %s ago, and nodes that have not reported to it since may hold them (counted in %s)",
			HoldersWarmup, idx.warming.Round(time.Second)))
	}
	if n := len(idx.unsure); n > 0 && (maybe > 0 || unknownImages > 0) {
		unknown = append(unknown, fmt.Sprintf("%d nodes that share blobs do not say which they hold (an imagepind older than this aggregator, or no report since it started): %s",
			n, nameFew(idx.unsure)))
	}
	if unknownWhy != "" && (maybe > 0 || unknownImages > 0) {
		unknown = append(unknown, "nodes that pin them do not know the blobs of some images yet: "+unknownWhy)
	}
	if maybe > 0 {
		unknown = append(unknown, fmt.Sprintf("%d blobs have fewer than %d holders known", maybe, status.MinBlobHolders))
	}
	if unknownImages > 0 {
		unknown = append(unknown, fmt.Sprintf("the blobs of %d images are not known to any node that shares", unknownImages))
	}
	h.Unknown = strings.Join(unknown, "; ")
	switch {
	case h.ShortCount > 0 || h.NoHolderCount > 0:
		h.Status = status.False
	case h.Unknown != "":
		h.Status = status.Unknown
	default:
		h.Status = status.True
	}
	return h
}

// setAnswer is the count for the images a set has on the nodes that report it.
func (idx *holdIndex) setAnswer(set string) status.BlobHolders {
	images := idx.sets[set]
	if len(images) == 0 {
		return status.HoldersUnknown("no live node says which images the set has on it (none reports it, or its imagepind is older than this aggregator)")
	}
	list := make([]string, 0, len(images))
	for img := range images {
		list = append(list, img)
	}
	return idx.answer(list)
}

// nameFew names the first maxNamedNodes of names and counts the rest.
func nameFew(names []string) string {
	if len(names) <= maxNamedNodes {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:maxNamedNodes], ", ") + fmt.Sprintf(" and %d more", len(names)-maxNamedNodes)
}

// Holders is the count for images (a node's imagepinctl check --registry-gone).
func (s *Store) Holders(images []string) status.BlobHolders {
	return s.holdersIndex().answer(images)
}

// Answer is what a node's report gets back of the blobs: the count for each set it
// reports, over the images its table gives the set, and whether the store lacks its
// table (want: the node sends it next). Nothing for a node that says nothing of its
// blobs.
func (s *Store) Answer(node string) (holders []*v1.SetHolders, want bool) {
	idx := s.holdersIndex()
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.nodes[node]
	if e == nil || e.blobs == nil {
		return nil, false
	}
	images := map[string][]string{}
	if t := e.blobs.table; t != nil {
		for _, im := range t.images {
			for _, set := range im.sets {
				images[set] = append(images[set], im.image)
			}
		}
	}
	for _, set := range e.status.Sets {
		h := status.HoldersUnknown("the aggregator is waiting for this node's list of blobs")
		if e.blobs.table != nil {
			h = idx.answer(images[set.Name])
		}
		holders = append(holders, &v1.SetHolders{Set: set.Name, Holders: v1.FromHolders(h)})
	}
	return holders, e.blobs.table == nil
}
