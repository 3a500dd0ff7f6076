package diskcheck

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/internal/bytesize"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/status"
)

// Config is what the real check needs besides registry access.
type Config struct {
	NodeName string
	// Multiplier: need = Multiplier × compressed layer bytes (2: layers are stored
	// uncompressed, and a pull holds both for a while).
	Multiplier             float64
	GCHighThresholdPercent int
	KubeletConfig          string
	KubeletConfigDir       string // the kubelet's --config-dir
	// KeepsCompressed: the node also keeps each layer's compressed blob ([peers]: the
	// node-local mirror's store), so every layer needs its compressed size once more.
	// Counted against the image filesystem (the state directory is on it on an
	// OpenShift node: both under /var).
	KeepsCompressed bool
	// ThroughMirror: registries are reached through the node-local mirror, which
	// serves pinned images only ([peers]): an image not pinned yet is sized from its
	// registry alone, and through the mirror (the node's store, its peers) once pinned.
	ThroughMirror bool
	// Store is the node's blob store ([peers]; nil: none). An image by digest whose
	// manifests it holds (seeded, or filled earlier) is sized from them, with no
	// registry request, pinned or not: the mirror serves it from there once pinned. A
	// layer it holds is on disk already: it needs no room for a copy in it
	// (KeepsCompressed).
	Store Store
	// Statfs measures the image filesystem (nil: Statfs); for benchmarks.
	Statfs func(string) (Space, error)
}

// Store is the node's blob store, read-only (blobstore.Store).
type Store interface {
	registry.Store
	// Size says whether the store holds d (committed, verified), and its size.
	Size(ctx context.Context, d digest.Digest) (int64, bool)
}

// ImageFS locates the runtime's image filesystem (CRI ImageFsInfo's mountpoint).
type ImageFS func(ctx context.Context) (string, error)

// Checker is the disk check: it sizes the missing images through the registries (as
// the runtime reaches them) and admits sets while their need fits the image filesystem.
type Checker struct {
	cfg      Config
	resolver *registry.Client
	imageFS  ImageFS
	statfs   func(string) (Space, error)
}

// New returns the disk check, sizing through resolver.
func New(cfg Config, resolver *registry.Client, imageFS ImageFS) *Checker {
	if cfg.Multiplier <= 0 {
		cfg.Multiplier = 2
	}
	statfs := cfg.Statfs
	if statfs == nil {
		statfs = Statfs
	}
	return &Checker{cfg: cfg, resolver: resolver, imageFS: imageFS, statfs: statfs}
}

type resolved struct {
	img registry.Image
	err error
	// stored are the layers the node's store holds (Config.Store).
	stored map[string]bool
}

// Check sizes every missing image (in parallel, cached), then admits sets in order
// while their cumulative need fits under both the free space and the GC threshold.
// early, when not nil, is told what may be pulled before the verdict (Early), once the
// manifests are read, when the verdict waits for Range requests.
func (r *Checker) Check(ctx context.Context, sets []SetRequest, early func(Early)) (Result, error) {
	// The registries and the runtime's image filesystem are asked at once: neither
	// waits for the other (ImageFsInfo can be slow on a busy runtime).
	foundCh := make(chan map[string]resolved, 1)
	// Layers keeps the source of an image with a layer not sized yet open (up to a
	// bound) so that sizing it below needs no new connection; whatever is left is closed
	// when the check ends.
	defer r.resolver.Release()
	go func() {
		found := r.resolveAll(ctx, sets, r.resolver.Layers)
		// The images present, for what the store will keep of them (their manifests
		// only: their layers need no room to be pulled).
		if present := r.presentOnly(sets, found); len(present) > 0 {
			for image, f := range r.resolveAll(ctx, []SetRequest{{Missing: present}}, r.resolver.Layers) {
				found[image] = f
			}
		}
		foundCh <- found
	}()
	path, err := r.imageFS(ctx)
	if err != nil {
		<-foundCh
		return Result{}, fmt.Errorf("image filesystem: %w", err)
	}
	space, err := r.statfs(path)
	if err != nil {
		<-foundCh
		return Result{}, err
	}
	threshold, thresholdFrom, terr := GCHighThreshold(r.cfg.GCHighThresholdPercent, r.cfg.KubeletConfig, r.cfg.KubeletConfigDir)
	res := Result{Filesystem: Filesystem{Path: path, CapacityBytes: space.Capacity, FreeBytes: space.Available}}

	found := <-foundCh
	limit := uint64(float64(space.Capacity) * float64(threshold) / 100)
	ad := admission{path: path, space: space, limit: limit, threshold: threshold, thresholdFrom: thresholdFrom, terr: terr}
	// The manifests alone decide when the uncompressed sizes not asked yet cannot change
	// the verdict: the same sets are admitted with each such layer at the floor and at
	// the most its Range request could report (see need.go). Otherwise those layers are
	// asked (a Range request each, on the image's source kept open since its manifest, or
	// opened again past the bound of open sources), and the check decides on them.
	verdicts := r.admit(sets, found, ad, false, nil)
	for round := 0; ; round++ {
		open := r.unsettled(sets, found)
		if len(open.layers) == 0 {
			break
		}
		upper := r.admit(sets, found, ad, true, nil)
		if sameAdmission(verdicts, upper) {
			// The real need lies between the two: each set's need is that range.
			most := map[string]uint64{}
			for name, v := range upper {
				most[name] = v.Need
			}
			verdicts = r.admit(sets, found, ad, false, most)
			break
		}
		if round == 0 && early != nil {
			if e, ok := r.early(sets, found, ad); ok {
				early(e)
				sets = withPulling(sets, e)
			}
		}
		// First the layers with the most at stake, as many as would bring the most all
		// the sets could need within the room were they to need their floor; if that does
		// not decide, every layer left.
		images := open.images(round == 0, ad.room())
		sized := r.resolveAll(ctx, []SetRequest{{Missing: images}}, r.resolver.Resolve)
		settle(found, images, sized)
		verdicts = r.admit(sets, found, ad, false, nil)
	}
	res.Verdicts = verdicts
	res.RoundTrip = r.resolver.RoundTrip()
	return res, nil
}

// early is what may be pulled before the verdict (Early): when one set alone misses
// images and none is pulling any early already, that set's images taken in its order,
// each whose layers not counted yet, at the most they could need, fit what is left of
// the room (one that does not is skipped; a smaller one after it may fit). Never with
// the node-local mirror's store (Config.KeepsCompressed): there a pin fills the store,
// and pins wait for the verdict.
func (r *Checker) early(sets []SetRequest, found map[string]resolved, ad admission) (Early, bool) {
	if r.cfg.KeepsCompressed {
		return Early{}, false
	}
	var only *SetRequest
	for i := range sets {
		switch {
		case len(sets[i].Pulling) > 0:
			return Early{}, false
		case len(sets[i].Missing) == 0:
		case only != nil:
			return Early{}, false
		default:
			only = &sets[i]
		}
	}
	if only == nil {
		return Early{}, false
	}
	room := ad.room()
	e := Early{Set: only.Name, Layers: map[string][]string{}, Bytes: map[string]uint64{}, RoundTrip: r.resolver.RoundTrip()}
	counted := map[string]bool{}
	var used uint64
	for _, image := range only.Missing {
		f := found[image]
		if f.err != nil || e.Layers[image] != nil {
			continue
		}
		var most uint64
		var fresh []string
		for _, l := range f.img.Layers {
			if counted[l.Digest] || l.Size <= 0 || slices.Contains(fresh, l.Digest) {
				continue
			}
			fresh = append(fresh, l.Digest)
			most = registry.AddSat(most, NeedMost(l, r.cfg.Multiplier))
		}
		if registry.AddSat(used, most) > room {
			continue
		}
		used = registry.AddSat(used, most)
		for _, d := range fresh {
			counted[d] = true
		}
		e.Images = append(e.Images, image)
		e.Layers[image] = layerDigests(f.img)
		e.Bytes[image] = f.img.Bytes()
	}
	return e, len(e.Images) > 0
}

// withPulling is sets with e's images pulling (SetRequest.Pulling), copied.
func withPulling(sets []SetRequest, e Early) []SetRequest {
	out := slices.Clone(sets)
	for i := range out {
		if out[i].Name == e.Set {
			out[i].Pulling = append(slices.Clone(out[i].Pulling), e.Images...)
		}
	}
	return out
}

func layerDigests(img registry.Image) []string {
	digests := make([]string, 0, len(img.Layers))
	for _, l := range img.Layers {
		digests = append(digests, l.Digest)
	}
	return digests
}

// presentOnly are the images of sets present on the node and not missing in any, each
// once, when the store keeps what the node pins (Config.KeepsCompressed); else none.
func (r *Checker) presentOnly(sets []SetRequest, found map[string]resolved) []string {
	if !r.cfg.KeepsCompressed {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for _, s := range sets {
		for _, image := range s.Present {
			if _, missing := found[image]; !missing && !seen[image] {
				seen[image] = true
				out = append(out, image)
			}
		}
	}
	return out
}

// openLayer is a layer whose uncompressed size a Range request could still learn.
type openLayer struct {
	image string // the first image holding it
	stake uint64 // its need at the most its request could report − at the floor
}

// openLayers are the layers not sized yet of a check, and the most all of them (and
// every sized layer) could need together.
type openLayers struct {
	layers []openLayer
	most   uint64
}

// images are the images to size: with first, those holding the layers of most stake
// until their stakes cover the most's excess over room; else every layer's.
func (o openLayers) images(first bool, room uint64) []string {
	layers := slices.Clone(o.layers)
	slices.SortStableFunc(layers, func(a, b openLayer) int { return cmp.Compare(b.stake, a.stake) })
	excess := uint64(0)
	if o.most > room {
		excess = o.most - room
	}
	var out []string
	seen := map[string]bool{}
	var covered uint64
	for _, l := range layers {
		if first && excess > 0 && covered >= excess {
			break
		}
		covered = registry.AddSat(covered, l.stake)
		if !seen[l.image] {
			seen[l.image] = true
			out = append(out, l.image)
		}
	}
	return out
}

// unsettled are the layers of the sets whose uncompressed size a Range request could
// still learn, each with the first image holding it.
func (r *Checker) unsettled(sets []SetRequest, found map[string]resolved) openLayers {
	var o openLayers
	seen := map[string]bool{}
	for _, s := range sets {
		for _, image := range s.Missing {
			f := found[image]
			if f.err != nil {
				continue
			}
			for _, l := range f.img.Layers {
				if seen[l.Digest] || l.Size <= 0 {
					continue
				}
				seen[l.Digest] = true
				floor := Need(l, r.cfg.Multiplier)
				if r.cfg.KeepsCompressed {
					floor = registry.AddSat(floor, uint64(l.Size))
				}
				if l.MaxUncompressed <= 0 {
					o.most = registry.AddSat(o.most, floor)
					continue
				}
				most := NeedMost(l, r.cfg.Multiplier)
				if r.cfg.KeepsCompressed {
					most = registry.AddSat(most, uint64(l.Size))
				}
				o.most = registry.AddSat(o.most, most)
				o.layers = append(o.layers, openLayer{image: image, stake: most - min(most, floor)})
			}
		}
	}
	return o
}

// settle takes the sizes learned for images into found, for every image holding the
// same layers. An image that could not be sized again (its source not kept, and the
// registry not answering now) has its layers settled at the floor, as a Range request
// that fails would: each round settles every layer it asks.
func settle(found map[string]resolved, images []string, sized map[string]resolved) {
	layers := map[string]registry.Layer{}
	for _, image := range images {
		f, ok := sized[image]
		if !ok || f.err != nil {
			f = found[image]
		}
		for _, l := range f.img.Layers {
			l.MaxUncompressed = 0
			layers[l.Digest] = l
		}
	}
	for image, f := range found {
		if f.err != nil {
			continue
		}
		img := registry.Image{Layers: slices.Clone(f.img.Layers)}
		for i, l := range img.Layers {
			if s, ok := layers[l.Digest]; ok && l.MaxUncompressed > 0 {
				img.Layers[i] = s
			}
		}
		found[image] = resolved{img: img, stored: f.stored}
	}
}

func sameAdmission(a, b map[string]Verdict) bool {
	for name, v := range a {
		if b[name].Admitted != v.Admitted {
			return false
		}
	}
	return true
}

// admission is what a check admits sets against.
type admission struct {
	path          string
	space         Space
	limit         uint64 // the used bytes past which the kubelet's image GC starts
	threshold     int
	thresholdFrom string
	terr          error
}

// room is what the sets may need together: the free space, and what is left below the
// GC threshold.
func (a admission) room() uint64 {
	if a.limit <= a.space.Used() {
		return 0
	}
	return min(a.space.Available, a.limit-a.space.Used())
}

// admit admits sets in order while their cumulative need fits under both the free
// space and the GC threshold. upper counts each layer not sized yet at the most its
// Range request could report (Layer.MaxUncompressed), not at the floor. most, when
// given, is each set's need with upper: the most its need can be (Verdict.NeedMost).
func (r *Checker) admit(sets []SetRequest, found map[string]resolved, ad admission, upper bool, most map[string]uint64) map[string]Verdict {
	verdicts := map[string]Verdict{}
	space, limit := ad.space, ad.limit
	counted := map[string]bool{} // layer digests of admitted (or undecided) sets
	// Images pulled before their set's verdict (SetRequest.Pulling) take room whatever
	// the verdicts: counted first, at their most, before any set is admitted.
	cumulative, pulling := r.pulling(sets, found, counted)
	for _, s := range sets {
		v := Verdict{Bytes: map[string]uint64{}, Layers: map[string][]string{}, Unavailable: map[string]string{}, Unsized: map[string]string{}}
		var layers, need, uncompressed uint64 // compressed bytes, need, of which sized uncompressed
		var stored uint64                     // compressed bytes the node's store holds already
		var forStore uint64                   // compressed bytes the store will grow by
		var transient []error
		sized := 0
		newLayers := map[string]bool{}
		for _, image := range s.Missing {
			f := found[image]
			switch {
			case f.err != nil && registry.IsUnavailable(f.err):
				v.Unavailable[image] = f.err.Error()
				continue
			case f.err != nil:
				transient = append(transient, f.err)
				v.Unsized[image] = f.err.Error()
				continue
			}
			sized++
			v.Bytes[image] = f.img.Bytes()
			v.Layers[image] = layerDigests(f.img)
			for _, l := range f.img.Layers {
				if counted[l.Digest] || newLayers[l.Digest] || l.Size <= 0 {
					continue
				}
				newLayers[l.Digest] = true
				if upper && l.MaxUncompressed > 0 {
					l.Uncompressed = l.MaxUncompressed
				}
				layers = registry.AddSat(layers, uint64(l.Size))
				need = registry.AddSat(need, Need(l, r.cfg.Multiplier))
				switch {
				case f.stored[l.Digest]:
					stored = registry.AddSat(stored, uint64(l.Size))
				case r.cfg.KeepsCompressed:
					forStore = registry.AddSat(forStore, uint64(l.Size))
				}
				if l.Uncompressed > 0 && !(upper && l.MaxUncompressed > 0) {
					uncompressed = registry.AddSat(uncompressed, uint64(l.Uncompressed))
				}
			}
		}
		// The store keeps the blobs of the images present too: the layers it lacks.
		var presentSized, presentUnsized int
		if r.cfg.KeepsCompressed {
			for _, image := range s.Present {
				f, ok := found[image]
				if !ok || f.err != nil {
					presentUnsized++
					continue
				}
				presentSized++
				for _, l := range f.img.Layers {
					if counted[l.Digest] || newLayers[l.Digest] || l.Size <= 0 {
						continue
					}
					newLayers[l.Digest] = true
					if f.stored[l.Digest] {
						stored = registry.AddSat(stored, uint64(l.Size))
					} else {
						forStore = registry.AddSat(forStore, uint64(l.Size))
					}
				}
			}
		}
		pull := need
		need = registry.AddSat(need, forStore)
		total := registry.AddSat(cumulative, need)
		// A set with nothing to pull (every image present, or every layer counted for a
		// set before it) fits whatever the disk says: refusing it frees nothing (its
		// present images stay pinned, and the store keeps their blobs), and a refusal
		// would let the pins of its images not pulled yet go just as the kubelet's image
		// GC starts deleting. What the store will keep of it still counts against the
		// sets after it.
		fits := pull == 0 || (total <= space.Available && registry.AddSat(space.Used(), total) <= limit)
		v.Need, v.NeedMost, v.ForStore = need, need, forStore
		if m, ok := most[s.Name]; ok && m > need {
			v.NeedMost = m
		}
		msg := r.describe(s.Name, sized, presentSized, layers, uncompressed, stored, forStore, v.Need, v.NeedMost, cumulative, presentUnsized, ad.path, space, ad.threshold, ad.thresholdFrom, ad.terr)
		switch {
		case !fits:
			v.Condition = status.Condition{Type: status.ConditionDiskChecked, Status: status.False, Reason: status.ReasonInsufficientDiskSpace, Message: msg}
		case len(transient) > 0:
			// Admitted on what could be sized; the rest wait for a later check.
			v.Admitted = true
			v.Condition = status.Condition{Type: status.ConditionDiskChecked, Status: status.Unknown, Reason: status.ReasonCheckingDisk,
				Message: fmt.Sprintf("%s; %d more could not be sized yet and wait for a later check%s: %v", msg, len(transient), r.waitsFor(), transient[0])}
		default:
			v.Admitted = true
			v.Condition = status.Condition{Type: status.ConditionDiskChecked, Status: status.True, Reason: status.ReasonSpaceAvailable, Message: msg}
		}
		if v.Admitted {
			for d := range newLayers {
				counted[d] = true
			}
			cumulative = total
		}
		switch p := pulling[s.Name]; {
		case len(s.Pulling) == 0:
		case v.Admitted:
			v.Condition.Message += fmt.Sprintf("; and up to %d of its images pulled while the check ran, %s at most, counted before any set", len(s.Pulling), bytesize.Human(p))
		default:
			v.Condition.Message += fmt.Sprintf("; up to %d of its images pulled while the check ran (%s at most, counted before any set) stay on the node, unpinned", len(s.Pulling), bytesize.Human(p))
		}
		verdicts[s.Name] = v
	}
	return verdicts
}

// pulling counts the images pulled before their set's verdict (SetRequest.Pulling),
// each layer once, at its most, into counted: their total, and each set's share.
func (r *Checker) pulling(sets []SetRequest, found map[string]resolved, counted map[string]bool) (uint64, map[string]uint64) {
	var total uint64
	per := map[string]uint64{}
	for _, s := range sets {
		for _, image := range s.Pulling {
			f := found[image]
			if f.err != nil {
				continue
			}
			for _, l := range f.img.Layers {
				if !counted[l.Digest] && l.Size > 0 {
					counted[l.Digest] = true
					n := NeedMost(l, r.cfg.Multiplier)
					total = registry.AddSat(total, n)
					per[s.Name] = registry.AddSat(per[s.Name], n)
				}
			}
		}
	}
	return total, per
}

// waitsFor says what a later check of an image not sized yet waits for.
func (r *Checker) waitsFor() string {
	if !r.cfg.ThroughMirror {
		return ""
	}
	return " (right after its pin is written, through the node-local mirror: the node's store and its peers; the error below is its registry's)"
}

// describe says a set's need: images to pull, present images sized for what the store
// keeps of them. need to most is its range (most == need: exact, as the sizes known make
// it); presentUnsized counts present images whose layers could not be known, so what
// the store keeps of them is not counted.
func (r *Checker) describe(set string, images, present int, layers, uncompressed, stored, forStore, need, most, before uint64, presentUnsized int, path string, space Space, threshold int, from string, terr error) string {
	how := fmt.Sprintf("%g × %s of layers", r.cfg.Multiplier, bytesize.Human(layers))
	if uncompressed > 0 {
		how += fmt.Sprintf(", or %s uncompressed + compressed where larger", bytesize.Human(uncompressed))
	}
	if r.cfg.KeepsCompressed {
		how += fmt.Sprintf(", + %s compressed for the node-local mirror's store", bytesize.Human(forStore))
		if presentUnsized > 0 {
			how += fmt.Sprintf(" (%d images on the node could not be sized: what the store lacks of them is not counted)", presentUnsized)
		}
	}
	if stored > 0 {
		how += fmt.Sprintf("; %s of the layers in the node's store already (seeded or fetched before)", bytesize.Human(stored))
	}
	amount := bytesize.Human(need)
	if most > need {
		amount += " to " + bytesize.Human(most)
		how += "; uncompressed sizes not asked: the real need lies between the floor and the most the layers' formats can hold, and the verdict is the same at either end"
	}
	which := fmt.Sprintf("%d images", images)
	if present > 0 {
		which += fmt.Sprintf(" (and %d on the node already, for the store)", present)
	}
	msg := fmt.Sprintf("node %s: %s need %s (%s) on %s", r.cfg.NodeName, which, amount, how, path)
	if before > 0 {
		msg += fmt.Sprintf(", after %s for the sets admitted before it", bytesize.Human(before))
	}
	msg += fmt.Sprintf("; %s free of %s; image GC starts at %d%%", bytesize.Human(space.Available), bytesize.Human(space.Capacity), threshold)
	if terr != nil {
		msg += fmt.Sprintf(" (%v)", terr)
	} else if from != "the kubelet's default" && from != "gc_high_threshold_percent" {
		msg += " (from " + from + ")"
	}
	return msg
}

// resolveAll asks resolve for every distinct missing image once, in parallel (the resolver bounds
// the requests in flight).
func (r *Checker) resolveAll(ctx context.Context, sets []SetRequest, resolve func(context.Context, string) (registry.Image, error)) map[string]resolved {
	out := map[string]resolved{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range sets {
		for _, image := range s.Missing {
			mu.Lock()
			_, seen := out[image]
			if !seen {
				out[image] = resolved{}
			}
			mu.Unlock()
			if seen {
				continue
			}
			wg.Add(1)
			go func(image string) {
				defer wg.Done()
				res := r.resolve(ctx, image, resolve)
				mu.Lock()
				out[image] = res
				mu.Unlock()
			}(image)
		}
	}
	wg.Wait()
	return out
}

// resolve sizes image from the node's store when it holds its manifests, else from its
// registry (fromRegistry: registry.Client's Layers or Resolve), and says which of its
// layers the store holds.
func (r *Checker) resolve(ctx context.Context, image string, fromRegistry func(context.Context, string) (registry.Image, error)) resolved {
	if r.cfg.Store == nil {
		img, err := fromRegistry(ctx, image)
		return resolved{img: img, err: err}
	}
	img, ok, err := r.resolver.ResolveStored(ctx, r.cfg.Store, image)
	if !ok {
		img, err = fromRegistry(ctx, image)
	}
	if err != nil {
		return resolved{err: err}
	}
	stored := map[string]bool{}
	for _, l := range img.Layers {
		if d, err := digest.Parse(l.Digest); err == nil {
			if _, ok := r.cfg.Store.Size(ctx, d); ok {
				stored[l.Digest] = true
			}
		}
	}
	return resolved{img: img, stored: stored}
}

// CachedImageFS asks f for the image filesystem at most every maxAge and otherwise
// answers what it said last: the mountpoint does not move while the runtime runs, and
// CRI-O computes ImageFsInfo by walking its whole storage (the CPU every pull waits for,
// at thousands of images), which can also fail in passing while pulls write to it. A
// failure with an answer at hand gives that answer.
func CachedImageFS(f ImageFS, maxAge time.Duration, now func() time.Time) ImageFS {
	var mu sync.Mutex
	var path string
	var at time.Time
	return func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if path != "" && now().Sub(at) < maxAge {
			return path, nil
		}
		p, err := f(ctx)
		if err != nil {
			if path != "" {
				return path, nil
			}
			return "", err
		}
		path, at = p, now()
		return path, nil
	}
}
