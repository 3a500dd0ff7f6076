package registry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/types"

	"github.com/imagepin/imagepin/pullcreds"
)

// Platform is an OCI platform.
type Platform struct {
	OS, Architecture, Variant string
}

func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// ParsePlatform parses "os/arch[/variant]".
func ParsePlatform(s string) (Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return Platform{}, fmt.Errorf("platform %q: want os/architecture[/variant]", s)
	}
	p := Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

// Layer is one layer blob.
type Layer struct {
	Digest string
	// Size is the blob's (compressed) size.
	Size int64
	// Uncompressed is what it takes once stored, when the blob says so (0: unknown);
	// From says how it was learned (FromGzipTrailer, FromZstdHeader, FromTar).
	Uncompressed int64
	From         string
	// MaxUncompressed, from Client.Layers, is the most the Range request not made yet
	// can report for the layer (what its format can decompress to at most, and what a
	// gzip trailer can say); 0 when the size is settled (asked already, or nothing to
	// ask: the multiplier decides).
	MaxUncompressed int64
}

// MaxLayerSize is the most bytes a layer is believed to have, compressed or not (1 TiB):
// a size read from the network beyond it is not taken (a manifest's is an error, a
// blob header's is "unknown"), so no sum of sizes can wrap around.
const MaxLayerSize = 1 << 40

// AddSat is a + b, or the largest uint64 where that overflows: a need too large to
// count is never admitted as a small one.
func AddSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// Image is what a registry says of one image for the node's platform.
type Image struct {
	Layers []Layer
}

// Bytes is the image's compressed size.
func (i Image) Bytes() uint64 {
	var n uint64
	for _, l := range i.Layers {
		if l.Size > 0 {
			n = AddSat(n, uint64(l.Size))
		}
	}
	return n
}

// UnavailableError means no endpoint can serve the image: retrying will not help until
// something changes (the registry, the mirror, the credentials, the platform).
type UnavailableError struct {
	Image string
	Err   error
}

func (e *UnavailableError) Error() string { return e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// Credentials returns what the kubelet would hand CRI-O for an image (nil: none).
type Credentials func(image string) *pullcreds.Auth

// Config says how to reach registries: the node's files, as CRI-O reads them.
type Config struct {
	RegistriesConf    string
	RegistriesConfDir string
	CertsDir          string
	Platform          Platform
	// Concurrency bounds requests in flight (images resolved at once).
	Concurrency int
	// LogEndpoints makes containers/image log each endpoint it tries ("Trying to
	// access") on logrus' standard logger, for EndpointRecorder.
	LogEndpoints bool
	// AuthFile is CRI-O's global_auth_file: where containers/image looks up a mirror's
	// credentials by the mirror's host (the credentials the kubelet hands CRI-O are for
	// the image's own registry, and containers/image never sends them to a mirror).
	// OpenShift points global_auth_file at the pull secret, /var/lib/kubelet/config.json.
	// "" means none.
	AuthFile string
	// NoUncompressedSizes skips the Range requests that learn each layer's uncompressed
	// size: the multiplier alone decides (for registries that mishandle Range).
	NoUncompressedSizes bool
	// RegistryFiles, when set, gives per image the registries.conf, its drop-in
	// directory and the certs.d directory to reach it by, in place of RegistriesConf,
	// RegistriesConfDir and CertsDir (containerd's hosts.toml, translated:
	// containerd.Hosts.Files).
	RegistryFiles func(image string) (conf, confDir, certsDir string)
	// SizeCache is a file keeping the layers' uncompressed sizes learned, by digest,
	// across restarts ("": none). One Client only may write it (the daemon's).
	SizeCache string
	// Timeout bounds the sizing of one image (default 30 s): a registry that accepts
	// connections and never answers leaves that image unsized (retried later), not the
	// whole check waiting.
	Timeout time.Duration
	// ConnectionPerImage reads every image through an image source of containers/image
	// of its own (its own connection and ping), not over the Client's one transport per
	// registry endpoint: what the Client did before; for benchmarks.
	ConnectionPerImage bool
}

// Client sizes images through containers/image, caching by digest reference
// (manifests are immutable).
type Client struct {
	cfg   Config
	creds Credentials
	// shared are the registry endpoints manifests are read on, a transport each (see
	// shared.go).
	shared sharedEndpoints
	sem    chan struct{}
	near   chan struct{} // the narrower bound while the registry is near or not measured

	mu    sync.Mutex
	cache map[string]Image
	usize map[string]layerSize // by layer digest
	kept  map[string]kept      // by image: sources Layers left open for Resolve
	// sizesDirty: usize holds a size the size cache file does not.
	sizesDirty bool
	ranges     atomic.Int64
	// inflight shares one Range request among the images that ask for the same layer
	// at once (a base layer under many images).
	inflight singleflight.Group
	// trips are recent per-request times of sizings (their wall time over their
	// requests): how far the registry is.
	trips []time.Duration
	// farNow is closed while the registries are measured far: sizings waiting for the
	// narrower bound go on at once. A new one replaces it when they measure near again.
	farNow    chan struct{}
	isFar     bool
	measuring bool // the wait for the first measure runs
}

type layerSize struct {
	size int64
	from string
}

// DefaultConcurrency is how many images are sized at once by default: a sizing is a
// few small requests, so many at once cost the registry little and hide its latency.
const DefaultConcurrency = 64

// New returns a resolver; creds may be nil.
func New(cfg Config, creds Credentials) *Client {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if creds == nil {
		creds = func(string) *pullcreds.Auth { return nil }
	}
	r := &Client{cfg: cfg, creds: creds, sem: make(chan struct{}, cfg.Concurrency), near: make(chan struct{}, min(nearWidth, cfg.Concurrency)),
		farNow: make(chan struct{}), cache: map[string]Image{}, usize: map[string]layerSize{}}
	r.loadSizes()
	return r
}

// uncompressed is a layer's uncompressed size, asked once per digest (layers are
// immutable) unless Config.NoUncompressedSizes.
func (r *Client) uncompressed(ctx context.Context, read rangeOf, l types.BlobInfo) (int64, string) {
	if r.cfg.NoUncompressedSizes {
		return 0, ""
	}
	key := l.Digest.String()
	r.mu.Lock()
	u, ok := r.usize[key]
	r.mu.Unlock()
	if ok {
		return u.size, u.from
	}
	v, _, _ := r.inflight.Do(key, func() (any, error) {
		size, from, requests := uncompressedSize(ctx, read, l)
		r.ranges.Add(int64(requests))
		if from != "" || ctx.Err() == nil { // a cancelled read may work next time
			r.mu.Lock()
			r.usize[key] = layerSize{size, from}
			r.sizesDirty = r.sizesDirty || from != ""
			r.mu.Unlock()
		}
		return layerSize{size, from}, nil
	})
	u = v.(layerSize)
	return u.size, u.from
}

// RoundTrip is the least time of a request to the registries of the recent sizings (the
// ping and the manifest of each, over two), 0 before any: how far the registry is, which
// the pull width starts from. The least, not the median: sizings run 64 at once, and
// their queueing (CPU, the registry) is not distance.
func (r *Client) RoundTrip() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.trips) == 0 {
		return 0
	}
	return slices.Min(r.trips)
}

// A registry whose least ping and manifest took farFrom or more per request is far;
// nearWidth is how many images are sized at once until one is measured far.
const (
	farFrom   = 40 * time.Millisecond
	nearWidth = 8
	// unmeasuredFor: a registry whose first sizings have not measured it within this
	// is far. A sizing is measured after its ping and manifest (with the connection,
	// four round trips and more); on loopback that takes milliseconds, behind a 200 ms
	// link most of a second, which the other images would wait out eight at a time.
	unmeasuredFor = 150 * time.Millisecond
)

// far says whether the registries measured so far are far (two sizings at least), and
// if not, a channel closed when they are. Before any measure, the first call starts the
// wait that takes the registry for far if no two sizings have measured it by then.
func (r *Client) far() (bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.trips) < 2 && !r.isFar && !r.measuring {
		r.measuring = true
		time.AfterFunc(unmeasuredFor, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.measuring = false
			if len(r.trips) < 2 && !r.isFar {
				r.isFar = true
				close(r.farNow)
			}
		})
	}
	return r.isFar, r.farNow
}

func (r *Client) recordTrip(took time.Duration, requests int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips = append(r.trips, took/time.Duration(requests))
	if len(r.trips) > 64 {
		r.trips = r.trips[len(r.trips)-64:]
	}
	if len(r.trips) < 2 {
		return // not measured yet: the first sizings' wait decides (unmeasuredFor)
	}
	far := slices.Min(r.trips) >= farFrom
	switch {
	case far && !r.isFar:
		close(r.farNow)
	case !far && r.isFar:
		r.farNow = make(chan struct{})
	}
	r.isFar = far
}

// Far says whether the registries are taken for far now (measured so, or not measured
// within unmeasuredFor): sizings then run Concurrency at once, not nearWidth.
func (r *Client) Far() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.isFar
}

// RangeRequests is how many Range requests the resolver made for uncompressed sizes.
func (r *Client) RangeRequests() int64 { return r.ranges.Load() }

// SystemContext is how containers/image reaches image: the node's registries.conf,
// certs.d, platform, and the credentials the kubelet would hand CRI-O for it. imagepin's
// code reads images through the Client's methods (Resolve, ResolveTag, OpenImage,
// Manifest, Blob), which bound and classify what the registry does.
func (r *Client) SystemContext(image string) *types.SystemContext {
	sys := &types.SystemContext{
		SystemRegistriesConfPath:    r.cfg.RegistriesConf,
		SystemRegistriesConfDirPath: r.cfg.RegistriesConfDir,
		DockerPerHostCertDirPath:    r.cfg.CertsDir,
		OSChoice:                    r.cfg.Platform.OS,
		ArchitectureChoice:          r.cfg.Platform.Architecture,
		VariantChoice:               r.cfg.Platform.Variant,
		DockerRegistryUserAgent:     "imagepin",
		DockerLogMirrorChoice:       r.cfg.LogEndpoints,
		// No ambient credentials: the kubelet's, as CRI-O gets them with each pull, and
		// for mirrors the global auth file's.
		AuthFilePath: noAuthFile,
	}
	if r.cfg.RegistryFiles != nil {
		sys.SystemRegistriesConfPath, sys.SystemRegistriesConfDirPath, sys.DockerPerHostCertDirPath = r.cfg.RegistryFiles(image)
	}
	if r.cfg.AuthFile != "" {
		sys.AuthFilePath = r.cfg.AuthFile
	}
	if a := r.creds(image); a != nil {
		sys.DockerAuthConfig = &types.DockerAuthConfig{Username: a.Username, Password: a.Password}
	}
	return sys
}

// Resolve returns the image's layers for the platform, with their uncompressed sizes
// (unless Config.NoUncompressedSizes). Errors are *UnavailableError when retrying cannot
// help; anything else is transient.
func (r *Client) Resolve(ctx context.Context, image string) (Image, error) {
	return r.get(ctx, image, !r.cfg.NoUncompressedSizes)
}

// Layers is Resolve without the Range requests: the manifest alone (a connection, the
// ping and the manifest). A layer whose uncompressed size is known already (asked for
// another image, or a plain tar) has it; one a Range request could still size says the
// most it could report (Layer.MaxUncompressed). Resolve sizes them, reading the manifest
// again.
func (r *Client) Layers(ctx context.Context, image string) (Image, error) {
	return r.get(ctx, image, false)
}

// known fills in the uncompressed sizes asked already, on a copy of img. r.mu is held.
func (r *Client) known(img Image) (Image, bool) {
	out := Image{Layers: slices.Clone(img.Layers)}
	settled := true
	for i, l := range out.Layers {
		if u, ok := r.usize[l.Digest]; ok {
			out.Layers[i].Uncompressed, out.Layers[i].From, out.Layers[i].MaxUncompressed = u.size, u.from, 0
		}
		if out.Layers[i].MaxUncompressed > 0 {
			settled = false
		}
	}
	return out, settled
}

func (r *Client) get(ctx context.Context, image string, ranges bool) (Image, error) {
	r.mu.Lock()
	img, ok := r.cache[image]
	settled := false
	if ok {
		img, settled = r.known(img)
	}
	r.mu.Unlock()
	if ok && (settled || !ranges) {
		return img, nil
	}
	// A near registry (or one not measured yet) is asked nearWidth images at a time:
	// there the registry's and this node's CPU limit, and 64 at once took twice as long
	// as 8 (`make bench`, 500 images on loopback). A far one, once measured, 64 at a
	// time: there every request is a round trip to wait for. Sizings already waiting
	// for the narrower bound when the registry is measured far go on at once (a check
	// asks for every image at the start, before anything is measured).
	if far, farNow := r.far(); !far {
		select {
		case r.near <- struct{}{}:
			defer func() { <-r.near }()
		case <-farNow:
		case <-ctx.Done():
			return Image{}, ctx.Err()
		}
	}
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return Image{}, ctx.Err()
	}
	defer func() { <-r.sem }()
	err := r.bounded(ctx, image, func(ctx context.Context) (err error) {
		img, err = r.resolve(ctx, image, ranges)
		return err
	})
	if err != nil {
		return Image{}, err
	}
	r.mu.Lock()
	r.cache[image] = img
	img, _ = r.known(img)
	r.mu.Unlock()
	return img, nil
}

func (r *Client) resolve(ctx context.Context, image string, ranges bool) (Image, error) {
	if ranges {
		r.mu.Lock()
		k, ok := r.kept[image]
		delete(r.kept, image)
		r.mu.Unlock()
		if ok {
			if k.src != nil {
				defer k.src.Close()
			}
			return r.sizeLayers(ctx, r.usizeFrom(k.read), k.img, k.infos), nil
		}
	}
	sys := r.SystemContext(image)
	if s, blob, mime, took, requests, err := r.openShared(ctx, image, sys); err == nil {
		r.recordTrip(took, requests)
		img, infos, err := r.imageOf(ctx, image, blob, mime, s.GetManifest)
		switch {
		case errors.Is(err, errShared): // a list's instance: containers/image reads it below
		case err != nil:
			return Image{}, err
		case !ranges:
			r.tarSizes(img, infos)
			r.keep(image, kept{read: s.readRange, img: img, infos: infos})
			return img, nil
		default:
			return r.sizeLayers(ctx, r.usizeFrom(s.readRange), img, infos), nil
		}
	}
	// Not for the shared connection: containers/image's own image source (a connection
	// and a ping of its own), which gives its own error.
	ref, err := docker.ParseReference("//" + image)
	if err != nil {
		return Image{}, err
	}
	start := time.Now()
	// NewImageSource tries the mirrors in registries.conf order, then the source, as
	// CRI-O does; its error names every endpoint tried.
	src, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		return Image{}, err
	}
	keptOpen := false
	defer func() {
		if !keptOpen {
			src.Close()
		}
	}()
	blob, mime, err := src.GetManifest(ctx, nil)
	if err != nil {
		return Image{}, fmt.Errorf("read manifest of %s: %w", image, err)
	}
	r.recordTrip(time.Since(start), 2) // the ping and the manifest
	img, infos, err := r.imageOf(ctx, image, blob, mime, src.GetManifest)
	if err != nil {
		return Image{}, err
	}
	read := func(ctx context.Context, l types.BlobInfo, off, n uint64) ([]byte, error) {
		return readRange(ctx, src, l, off, n)
	}
	if !ranges {
		r.tarSizes(img, infos)
		keptOpen = r.keep(image, kept{src: src, read: read, img: img, infos: infos})
		return img, nil
	}
	return r.sizeLayers(ctx, r.usizeFrom(read), img, infos), nil
}

// tarSizes settles the layers of img that are plain tars: their own size, nothing to ask.
func (r *Client) tarSizes(img Image, infos []types.BlobInfo) {
	for i := range img.Layers {
		if img.Layers[i].MaxUncompressed > 0 && isTar(infos[i]) {
			img.Layers[i].Uncompressed, img.Layers[i].From, img.Layers[i].MaxUncompressed = infos[i].Size, FromTar, 0
		}
	}
}

// usizeFrom sizes layers by read (Client.uncompressed).
func (r *Client) usizeFrom(read rangeOf) func(context.Context, types.BlobInfo) (int64, string) {
	return func(ctx context.Context, l types.BlobInfo) (int64, string) { return r.uncompressed(ctx, read, l) }
}

// imageOf is what the manifest blob (of type mime) of image says of it for the node's
// platform: a list's instance for it (read with getManifest), and its layers with their
// descriptors, no uncompressed size asked yet. Whatever the manifests come from (a
// registry, the node's store), images are parsed here.
func (r *Client) imageOf(ctx context.Context, image string, blob []byte, mime string,
	getManifest func(context.Context, *digest.Digest) ([]byte, string, error)) (Image, []types.BlobInfo, error) {
	if manifest.MIMETypeIsMultiImage(mime) {
		list, err := manifest.ListFromBlob(blob, mime)
		if err != nil {
			return Image{}, nil, fmt.Errorf("parse manifest list of %s: %w", image, err)
		}
		instance, err := list.ChooseInstance(&types.SystemContext{OSChoice: r.cfg.Platform.OS,
			ArchitectureChoice: r.cfg.Platform.Architecture, VariantChoice: r.cfg.Platform.Variant})
		if err != nil {
			return Image{}, nil, fmt.Errorf("%s has no manifest for %s (no image found in manifest list): it has %s",
				image, r.cfg.Platform, strings.Join(ListPlatforms(list), ", "))
		}
		if blob, mime, err = getManifest(ctx, &instance); err != nil {
			return Image{}, nil, fmt.Errorf("read %s manifest %s of %s: %w", r.cfg.Platform, instance, image, err)
		}
	}
	m, err := manifest.FromBlob(blob, manifest.NormalizedMIMEType(mime))
	if err != nil {
		return Image{}, nil, fmt.Errorf("parse manifest of %s: %w", image, err)
	}
	var img Image
	var infos []types.BlobInfo
	for _, l := range m.LayerInfos() {
		if l.EmptyLayer {
			continue
		}
		if l.Size > MaxLayerSize {
			// A manifest's word is not taken for an absurd size: it would overflow the
			// sums, or make any set look too large to pin.
			return Image{}, nil, fmt.Errorf("manifest of %s: layer %s claims %d bytes, more than the 1 TiB a layer can plausibly have", image, l.Digest, l.Size)
		}
		layer := Layer{Digest: l.Digest.String(), Size: l.Size}
		if !r.cfg.NoUncompressedSizes {
			layer.MaxUncompressed = maxUncompressed(l.BlobInfo)
		}
		img.Layers = append(img.Layers, layer)
		infos = append(infos, l.BlobInfo)
	}
	return img, infos, nil
}

// kept is an image whose manifest Layers read, kept for Resolve to size the image's
// layers on the same endpoint (no second ping and manifest): over the shared
// connection, or on containers/image's image source left open (src).
type kept struct {
	src   types.ImageSource // nil: the shared connection's
	read  rangeOf
	img   Image
	infos []types.BlobInfo
}

// maxKept bounds the image sources of containers/image Layers keeps open (an idle
// connection each); images read over the shared connection hold none.
const maxKept = 256

// keep keeps k for Resolve when a layer of its image is not sized yet and, for an open
// image source, fewer than maxKept are kept.
func (r *Client) keep(image string, k kept) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, settled := r.known(k.img); settled {
		return false
	}
	if k.src != nil {
		open := 0
		for _, o := range r.kept {
			if o.src != nil {
				open++
			}
		}
		if open >= maxKept {
			return false
		}
	}
	if _, ok := r.kept[image]; ok {
		return false
	}
	if r.kept == nil {
		r.kept = map[string]kept{}
	}
	r.kept[image] = k
	return true
}

// Release closes the image sources Layers kept open (the caller will not ask Resolve
// for their sizes now), and writes the sizes learned to Config.SizeCache.
func (r *Client) Release() error {
	r.mu.Lock()
	k := r.kept
	r.kept = nil
	r.mu.Unlock()
	for _, s := range k {
		if s.src != nil {
			s.src.Close()
		}
	}
	return r.saveSizes()
}

// farRangesPerImage is how many of an image's Range requests run at once when the
// registry is far. Near, they run one after another on the image's connection: there
// the CPU of more connections (a TLS handshake each over HTTP/1.1) costs more than they
// hide, 2.35 s against 1.33 s for 500 images on loopback. Far, each request is a round
// trip waited for, and an image's layers asked one after another cost as many round
// trips as it has layers not sized yet.
const farRangesPerImage = 4

// sizeLayers asks usize for the uncompressed size of each layer of img (cached by
// digest), on a copy of img.
func (r *Client) sizeLayers(ctx context.Context, usize func(context.Context, types.BlobInfo) (int64, string), img Image, infos []types.BlobInfo) Image {
	img.Layers = slices.Clone(img.Layers)
	var wg sync.WaitGroup
	width := 1
	if r.Far() {
		width = farRangesPerImage
	}
	sem := make(chan struct{}, width)
	for i := range img.Layers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			img.Layers[i].Uncompressed, img.Layers[i].From = usize(ctx, infos[i])
			img.Layers[i].MaxUncompressed = 0
		}()
	}
	wg.Wait()
	return img
}

// ListPlatforms names a manifest list's entries (os/arch[/variant]), in its order.
func ListPlatforms(list manifest.List) []string {
	var out []string
	for _, d := range list.Instances() {
		inst, err := list.Instance(d)
		if err != nil || inst.ReadOnly.Platform == nil {
			out = append(out, "unknown")
			continue
		}
		p := Platform{OS: inst.ReadOnly.Platform.OS, Architecture: inst.ReadOnly.Platform.Architecture, Variant: inst.ReadOnly.Platform.Variant}
		out = append(out, p.String())
	}
	return out
}

// IsUnavailable says whether an error from Resolve is permanent.
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}

// noAuthFile does not exist, which containers/image reads as "no credentials" (an
// empty file would be a parse error).
const noAuthFile = "/nonexistent/imagepin/no-auth.json"
