package mirror

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

// fakeSource serves one image's manifest and blobs from memory, counting requests.
type fakeSource struct {
	manifest  []byte
	mediaType string
	blobs     map[digest.Digest][]byte
	corrupt   bool
	calls     atomic.Int64
	// tail are bytes sent after each blob, announced (a sender streaming without
	// end); announce, when set, is the size announced instead of the blob's.
	tail, announce int64
	// read are the blob bytes handed out.
	read atomic.Int64
}

func (s *fakeSource) Manifest(_ context.Context, _ string, _ []digest.Digest, d digest.Digest, _ int64) ([]byte, string, error) {
	s.calls.Add(1)
	if digest.FromBytes(s.manifest) != d {
		return nil, "", errors.New("manifest unknown")
	}
	return s.manifest, s.mediaType, nil
}

func (s *fakeSource) Blob(_ context.Context, _ string, _ []digest.Digest, d digest.Digest, _ int64) (io.ReadCloser, int64, error) {
	s.calls.Add(1)
	b, ok := s.blobs[d]
	if !ok {
		return nil, 0, errors.New("blob unknown")
	}
	if s.corrupt {
		b = append([]byte(nil), b...)
		b[len(b)/2] ^= 0xff
	}
	size := int64(len(b))
	var r io.Reader = bytes.NewReader(b)
	if s.tail > 0 {
		r, size = io.MultiReader(r, io.LimitReader(zeros{}, s.tail)), size+s.tail
	}
	if s.announce != 0 {
		size = s.announce
	}
	return io.NopCloser(&countReader{r, &s.read}), size, nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func newImage(t *testing.T) (v1.Image, *fakeSource) {
	t.Helper()
	img, err := random.Image(256<<10, 3)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := img.RawManifest()
	mt, _ := img.MediaType()
	src := &fakeSource{manifest: raw, mediaType: string(mt), blobs: map[digest.Digest][]byte{}}
	cfg, _ := img.RawConfigFile()
	src.blobs[digest.FromBytes(cfg)] = cfg
	layers, _ := img.Layers()
	for _, l := range layers {
		rc, _ := l.Compressed()
		b, _ := io.ReadAll(rc)
		src.blobs[digest.FromBytes(b)] = b
	}
	return img, src
}

const repo = "src.example/team/app"

// served is a mirror under test: its server, the mirror, its store and its counters.
type served struct {
	srv   *httptest.Server
	m     *Mirror
	store *blobstore.Store
	stats *Stats
	dir   string // the store's
}

func serve(t *testing.T, src Source, pinned Pinned) served {
	t.Helper()
	dir := t.TempDir()
	store, err := blobstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := New(store, pinned, logrus.New())
	stats := &Stats{}
	srv := httptest.NewServer(m.Handler(src, stats))
	t.Cleanup(srv.Close)
	return served{srv, m, store, stats, dir}
}

// pullThrough pulls repo@d from the mirror at srv with go-containerregistry (which
// checks every digest), reading the config and every layer, and returns its layers.
func pullThrough(t *testing.T, srv *httptest.Server, repo string, d fmt.Stringer) []v1.Layer {
	t.Helper()
	ref, err := name.NewDigest(strings.TrimPrefix(srv.URL, "http://")+"/"+repo+"@"+d.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := got.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, rc); err != nil {
			t.Fatalf("layer: %v", err)
		}
		rc.Close()
	}
	if _, err := got.RawConfigFile(); err != nil {
		t.Fatal(err)
	}
	return layers
}

// A real client (go-containerregistry, which checks every digest) pulls a pinned image
// through the mirror: from the source the first time, from the store the second.
func TestPinnedImageThroughTheMirror(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return r == repo && dd.String() == d.String() })
	pull := func() { pullThrough(t, s.srv, repo, d) }
	pull()
	fromSource := src.calls.Load()
	if fromSource != 5 { // manifest, config, 3 layers
		t.Fatalf("source asked %d times, want 5", fromSource)
	}
	used, _ := s.store.Usage(context.Background())
	t.Logf("first pull: %d bytes transferred from the source; the store holds %d bytes", s.stats.Transferred.Load(), used)
	pull()
	if src.calls.Load() != fromSource {
		t.Fatalf("the second pull went to the source (%d calls)", src.calls.Load()-fromSource)
	}
	if s.stats.FromStore.Load() == 0 {
		t.Fatal("nothing served from the store")
	}
}

// Anything not pinned is 404 at once, without asking the source: an unpinned pull
// goes on to its registry untouched.
func TestOnlyPinnedIsServed(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	srv := serve(t, src, func(string, digest.Digest) bool { return false }).srv
	for _, path := range []string{
		"/v2/" + repo + "/manifests/" + d.String(),
		"/v2/" + repo + "/manifests/latest",
		"/v2/" + repo + "/blobs/" + d.String(),
		"/v2/nothing",
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, resp.StatusCode)
		}
	}
	if src.calls.Load() != 0 {
		t.Fatalf("the source was asked %d times for what is not pinned", src.calls.Load())
	}
	resp, err := http.Get(srv.URL + "/v2/")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/v2/: %v %v", resp, err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v2/"+repo+"/manifests/"+d.String(), nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("PUT: %v %v", resp, err)
	}
	resp.Body.Close()
}

// A source serving corrupted bytes: the client's copy is cut (it retries elsewhere),
// and nothing wrong is stored.
func TestCorruptSourceStoresNothing(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
	srv, store := s.srv, s.store
	resp, err := http.Get(srv.URL + "/v2/" + repo + "/manifests/" + d.String())
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest: %v %v", resp, err)
	}
	resp.Body.Close()
	src.corrupt = true
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	resp, err = http.Get(srv.URL + "/v2/" + repo + "/blobs/" + ld.String())
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("a corrupted blob was sent whole, as if it were good")
	}
	if _, ok := store.Size(context.Background(), digest.Digest(ld.String())); ok {
		t.Fatal("a corrupted blob was stored")
	}
}

// The mirror over the node's real registry access (registry.Client, containers/image):
// a disconnected layout (the source does not exist, the administrator's mirror needs
// the pull secret and a CA from certs.d); a client pulling by digest from the mirror gets
// every byte right, and the mirror's store then holds the image.
func TestFillThroughTheNodesRegistryAccess(t *testing.T) {
	reg := registrytest.New(t, map[string]string{"ocp": "puller:ppass"})
	img := registrytest.Image(t, registrytest.RandomLayer(t, 300<<10), registrytest.RandomLayer(t, 200<<10))
	repoDigest := reg.Push("ocp/release", img, "puller:ppass")
	d := digest.Digest(strings.SplitN(repoDigest, "@", 2)[1])
	f := registrytest.NewFiles(t, fmt.Sprintf("[[registry]]\nprefix = \"upstream.example.invalid/ocp\"\nlocation = \"upstream.example.invalid/ocp\"\n[[registry.mirror]]\nlocation = %q\npull-from-mirror = \"digest-only\"\n", reg.Host+"/ocp"))
	reg.WriteCA(f.Certs)
	// The pull secret names the administrator's mirror, as a disconnected node's does.
	authFile := filepath.Join(f.Dir, "config.json")
	secret := fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, reg.Host, base64.StdEncoding.EncodeToString([]byte("puller:ppass")))
	if err := os.WriteFile(authFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	source := FromRegistry(registry.New(registry.Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, AuthFile: authFile},
		func(string) *pullcreds.Auth { return nil }))
	const src = "upstream.example.invalid/ocp/release"
	s := serve(t, source, func(r string, dd digest.Digest) bool { return r == src && dd == d })
	layers := pullThrough(t, s.srv, src, d)
	used, _ := s.store.Usage(context.Background())
	want := int64(registrytest.LayerBytes(t, layers...))
	if used < want {
		t.Fatalf("store holds %d bytes, the layers alone are %d", used, want)
	}
	t.Logf("through the node's access: %d bytes from the registry, %d stored", s.stats.Transferred.Load(), used)
}

func TestPathForRoundTrips(t *testing.T) {
	for repo, path := range map[string]string{
		"127.0.0.1:38443/ns/app":    "127.0.0.1_38443/ns/app",
		"quay.io/openshift/etcd":    "quay.io/openshift/etcd",
		"registry.example:5000/a/b": "registry.example_5000/a/b",
	} {
		if got := PathFor(repo); got != path {
			t.Errorf("PathFor(%s) = %s, want %s", repo, got, path)
		}
		if got := SourceRepo(path); got != repo {
			t.Errorf("SourceRepo(%s) = %s, want %s", path, got, repo)
		}
	}
}

// Blobs no pinned reference needs leave the store; a pinned image's stay.
func TestPruneKeepsWhatIsPinned(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	pinnedRef := repo + "@" + d.String()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return r+"@"+dd.String() == pinnedRef })
	m, store := s.m, s.store
	layers := pullThrough(t, s.srv, repo, d)
	ctx := context.Background()
	before, _ := store.Usage(ctx)
	if n, freed, err := m.Prune(ctx, []string{pinnedRef}); err != nil || n != 0 || freed != 0 {
		t.Fatalf("pruning while pinned: %d blobs, %d bytes, %v", n, freed, err)
	}
	if ld, _ := layers[0].Digest(); !m.allowed(repo, digest.Digest(ld.String())) {
		t.Fatal("a pinned image's layer is no longer served after a prune")
	}
	n, freed, err := m.Prune(ctx, nil)
	if err != nil || n != 5 || freed != before {
		t.Fatalf("pruning after the unpin: %d blobs, %d bytes (of %d), %v", n, freed, before, err)
	}
	if used, _ := store.Usage(ctx); used != 0 {
		t.Fatalf("%d bytes left", used)
	}
	if ld, _ := layers[0].Digest(); m.allowed(repo, digest.Digest(ld.String())) {
		t.Fatal("an unpinned image's layer is still served")
	}
}

// slowSource hands out each blob in small pieces with pauses, so requests overlap.
type slowSource struct{ *fakeSource }

func (s slowSource) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, want int64) (io.ReadCloser, int64, error) {
	rc, size, err := s.fakeSource.Blob(ctx, repo, chain, d, want)
	if err != nil {
		return nil, 0, err
	}
	return io.NopCloser(&trickle{r: rc}), size, nil
}

type trickle struct{ r io.Reader }

func (t *trickle) Read(p []byte) (int, error) {
	time.Sleep(2 * time.Millisecond)
	return t.r.Read(p[:min(len(p), 8<<10)])
}

// Eight clients asking for the same blobs at once get them from one transfer each:
// the source is asked once per blob, and every client gets every byte right.
func TestConcurrentRequestsShareOneTransfer(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, slowSource{src}, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
	resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + d.String())
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest: %v %v", resp, err)
	}
	resp.Body.Close()
	before := src.calls.Load()
	layers, _ := img.Layers()
	var wg sync.WaitGroup
	errs := make(chan error, 8*len(layers))
	for i := 0; i < 8; i++ {
		for _, l := range layers {
			ld, _ := l.Digest()
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/blobs/" + ld.String())
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err == nil && digest.FromBytes(b).String() != ld.String() {
					err = fmt.Errorf("%s: got %d bytes that do not match", ld, len(b))
				}
				if err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := src.calls.Load() - before; got != int64(len(layers)) {
		t.Fatalf("the source was asked %d times for %d blobs by 8 clients each", got, len(layers))
	}
}

// A client resuming with Range gets the rest of a blob, whether it is being filled or
// stored.
func TestRangeResumes(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, slowSource{src}, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
	resp, _ := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + d.String())
	resp.Body.Close()
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	whole := src.blobs[digest.Digest(ld.String())]
	for _, when := range []string{"while filled", "stored"} {
		req, _ := http.NewRequest(http.MethodGet, s.srv.URL+"/v2/"+repo+"/blobs/"+ld.String(), nil)
		req.Header.Set("Range", "bytes=1000-")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(b, whole[1000:]) {
			t.Fatalf("%s: status %d, %d bytes (want %d), %v", when, resp.StatusCode, len(b), len(whole)-1000, err)
		}
	}
}

// The peers' side (chained): a blob is served to a request whose chain leads to a
// pinned manifest, even if this node never served that manifest; without the chain,
// or with one that leads nowhere pinned, it is a 404 and the source is not asked.
func TestChainAdmitsPeerRequests(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	md := digest.Digest(d.String())
	store, err := blobstore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := New(store, func(r string, dd digest.Digest) bool { return dd == md }, logrus.New())
	srv := httptest.NewServer(m.PeerHandler(src, src, &Stats{}))
	t.Cleanup(srv.Close)
	layers, _ := img.Layers()
	ld, _ := layers[1].Digest()
	get := func(chain string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v2/"+repo+"/blobs/"+ld.String(), nil)
		if chain != "" {
			req.Header.Set(ChainHeader, chain)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && digest.FromBytes(b).String() != ld.String() {
			t.Fatal("wrong bytes")
		}
		return resp.StatusCode
	}
	other := digest.FromString("not pinned")
	for chain, want := range map[string]int{"": 404, other.String(): 404, "garbage": 404} {
		if got := get(chain); got != want {
			t.Errorf("chain %q: %d, want %d", chain, got, want)
		}
	}
	if src.calls.Load() != 0 {
		t.Fatalf("the source was asked %d times for requests that lead to nothing pinned", src.calls.Load())
	}
	if got := get(md.String()); got != http.StatusOK {
		t.Fatalf("chain to the pinned manifest: %d", got)
	}
}

// A request that missed the store just before a fill committed the blob opens it after:
// it reads the stored blob, and the store is not taken for a failing one (which would
// stream every blob without storing it for a minute, one transfer a request).
func TestOpenAfterTheFillCommitted(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
	pullThrough(t, s.srv, repo, d)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	whole := src.blobs[digest.Digest(ld.String())]
	rd, size, err := s.m.open(context.Background(), repo, nil, digest.Digest(ld.String()), int64(len(whole)), src)
	if err != nil {
		t.Fatal(err)
	}
	err = rd.skip(100)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rd)
	rd.Close()
	if err != nil || size != int64(len(whole)) || !bytes.Equal(b, whole[100:]) {
		t.Fatalf("%d bytes of %d (size %d): %v", len(b), len(whole)-100, size, err)
	}
	if !s.m.storeFailed.IsZero() {
		t.Fatal("a blob already stored made the mirror take its store for a failing one")
	}
}

// An ingest a killed imagepind left (a fill cut by kill -9 or a reboot) goes at the
// next prune; a fill under way keeps its own.
func TestPruneReleasesIngestsLeftByAKill(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	dir := t.TempDir()
	ctx := context.Background()
	killed, err := blobstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	w, err := killed.Writer(ctx, digest.Digest(ld.String()), -1)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(src.blobs[digest.Digest(ld.String())][:1000]) // never closed: "kill -9"
	store, err := blobstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := New(store, func(r string, dd digest.Digest) bool { return dd.String() == d.String() }, logrus.New())
	n, freed, err := m.Prune(ctx, []string{repo + "@" + d.String()})
	if err != nil || n != 1 || freed != 1000 {
		t.Fatalf("prune: %d released, %d bytes, %v; want the killed fill's ingest", n, freed, err)
	}
	if _, err := os.Stat(store.IngestFile(digest.Digest(ld.String()))); !os.IsNotExist(err) {
		t.Fatalf("the killed fill's ingest is still there: %v", err)
	}
}

// A fill stops at the size the manifest gives: a source streaming on past it (48 MiB
// for a 256 KiB layer) is cut there, whether the blob is stored or streamed without
// storing; one announcing another size is refused before anything is read. The
// client's copy is cut, nothing is stored.
func TestAFillStopsAtTheDescriptorsSize(t *testing.T) {
	for _, c := range []struct {
		name           string
		tail, announce int64
		noStore        bool
	}{
		{name: "streaming on", tail: 48 << 20},
		{name: "streaming on, not stored", tail: 48 << 20, noStore: true},
		{name: "announcing 48 MiB", announce: 48 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			img, src := newImage(t)
			d, _ := img.Digest()
			s := serve(t, src, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
			resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + d.String())
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("manifest: %v %v", resp, err)
			}
			resp.Body.Close()
			if c.noStore {
				s.m.storeFailed = time.Now()
			}
			src.tail, src.announce = c.tail, c.announce
			layers, _ := img.Layers()
			ld, _ := layers[0].Digest()
			size := int64(len(src.blobs[digest.Digest(ld.String())]))
			resp, err = http.Get(s.srv.URL + "/v2/" + repo + "/blobs/" + ld.String())
			if err == nil {
				if resp.StatusCode == http.StatusOK {
					_, err = io.ReadAll(resp.Body)
				} else {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				resp.Body.Close()
			}
			if err == nil {
				t.Fatal("a blob longer than its descriptor was served as whole")
			}
			want := size + 1 // the blob, and one byte that says there is more
			if c.announce != 0 {
				want = 0
			}
			if got := src.read.Load(); got > want {
				t.Fatalf("%d bytes read from the source for a blob of %d (want at most %d)", got, size, want)
			}
			if _, ok := s.store.Size(context.Background(), digest.Digest(ld.String())); ok {
				t.Fatal("stored")
			}
		})
	}
}

// A blob whose manifest gives no size is not fetched: nothing would bound the fill.
func TestABlobWithoutASizeIsNotFetched(t *testing.T) {
	layer := []byte("a layer")
	ld := digest.FromBytes(layer)
	man := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":%q,"size":2},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":%q}]}`, digest.FromString("{}"), ld))
	src := &fakeSource{manifest: man, mediaType: "application/vnd.oci.image.manifest.v1+json", blobs: map[digest.Digest][]byte{ld: layer}}
	md := digest.FromBytes(man)
	s := serve(t, src, func(_ string, d digest.Digest) bool { return d == md })
	resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + md.String())
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(s.srv.URL + "/v2/" + repo + "/blobs/" + ld.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || src.calls.Load() != 1 {
		t.Fatalf("a blob without a size: %d, the source asked %d times", resp.StatusCode, src.calls.Load())
	}
}

// gatedSource holds each manifest fetch until release is closed (or its context ends).
type gatedSource struct {
	*fakeSource
	started, release chan struct{}
}

func (s gatedSource) Manifest(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) ([]byte, string, error) {
	select {
	case s.started <- struct{}{}:
	default:
	}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	return s.fakeSource.Manifest(ctx, repo, chain, d, size)
}

// Requests asking for a manifest at once share one fetch, but the one that started it
// going away (a cancelled pull) does not fail the others.
func TestACancelledRequestDoesNotFailTheOthers(t *testing.T) {
	img, fake := newImage(t)
	d, _ := img.Digest()
	md := digest.Digest(d.String())
	src := gatedSource{fake, make(chan struct{}, 1), make(chan struct{})}
	s := serve(t, src, func(_ string, dd digest.Digest) bool { return dd == md })
	first, cancel := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() {
		_, _, err := s.m.loadManifest(first, repo, nil, md, src)
		firstErr <- err
	}()
	<-src.started
	second := make(chan error, 1)
	go func() {
		_, _, err := s.m.loadManifest(context.Background(), repo, nil, md, src)
		second <- err
	}()
	time.Sleep(20 * time.Millisecond) // the second joins the first's fetch
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled request: %v", err)
	}
	close(src.release)
	if err := <-second; err != nil {
		t.Fatalf("the request joined to a cancelled one: %v", err)
	}
	if n := fake.calls.Load(); n != 1 {
		t.Fatalf("the source was asked %d times", n)
	}
}

// Only manifests are served as manifests: a config or layer the mirror knows (or
// holds) is a 404 on the manifests endpoint, without asking the source; and data that
// is no manifest, even under a pinned digest it matches, is neither served as one nor
// stored.
func TestOnlyManifestsAreServedAsManifests(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
	pullThrough(t, s.srv, repo, d)
	calls := src.calls.Load()
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	cd, _ := img.ConfigName()
	for _, b := range []fmt.Stringer{ld, cd} {
		resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + b.String())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("the blob %s on the manifests endpoint: %d, want 404", b, resp.StatusCode)
		}
	}
	if src.calls.Load() != calls {
		t.Fatal("the source was asked for a blob as a manifest")
	}

	// A config pinned as if it were a manifest (the source sends it, its digest right).
	cfg, _ := img.RawConfigFile()
	notManifest := &fakeSource{manifest: cfg, mediaType: "application/vnd.oci.image.manifest.v1+json"}
	cfgDigest := digest.FromBytes(cfg)
	s2 := serve(t, notManifest, func(_ string, dd digest.Digest) bool { return dd == cfgDigest })
	resp, err := http.Get(s2.srv.URL + "/v2/" + repo + "/manifests/" + cfgDigest.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a config under a pinned digest: %d, want 404", resp.StatusCode)
	}
	if _, ok := s2.store.Size(context.Background(), cfgDigest); ok {
		t.Fatal("a config was stored as a manifest")
	}
}

// A stored blob corrupted on disk after its commit is checked as it is served: the
// client's copy is cut (never whole), the blob leaves the store, and the next request
// fills it again, right.
func TestACorruptedStoredBlobIsCutAndFilledAgain(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	s := serve(t, src, func(r string, dd digest.Digest) bool { return dd.String() == d.String() })
	pullThrough(t, s.srv, repo, d)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	path := filepath.Join(s.dir, "blobs", "sha256", ld.Hex)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	get := func(rangeFrom int) ([]byte, error) {
		req, _ := http.NewRequest(http.MethodGet, s.srv.URL+"/v2/"+repo+"/blobs/"+ld.String(), nil)
		if rangeFrom > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", rangeFrom))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		return io.ReadAll(resp.Body)
	}
	calls := src.calls.Load()
	if b, err := get(0); err == nil {
		t.Fatalf("a corrupted stored blob was served whole (%d bytes)", len(b))
	}
	if _, ok := s.store.Size(context.Background(), digest.Digest(ld.String())); ok {
		t.Fatal("the corrupted blob is still stored")
	}
	whole := src.blobs[digest.Digest(ld.String())]
	b, err := get(1000)
	if err != nil || !bytes.Equal(b, whole[1000:]) {
		t.Fatalf("the next request: %d bytes, %v", len(b), err)
	}
	if src.calls.Load() != calls+1 {
		t.Fatalf("the source was asked %d times, want once", src.calls.Load()-calls)
	}
	// Stored again, right: a Range read from the store is checked whole too.
	if b, err := get(1000); err != nil || !bytes.Equal(b, whole[1000:]) {
		t.Fatalf("from the store again: %d bytes, %v", len(b), err)
	}
}

// failingSource serves manifests from src and fails every blob with err, as peers do
// when no node holds a blob and the registry is gone.
type failingSource struct {
	*fakeSource
	err error
}

func (s failingSource) Blob(context.Context, string, []digest.Digest, digest.Digest, int64) (io.ReadCloser, int64, error) {
	return nil, 0, s.err
}

// A 404 says why: a pinned blob whose fill failed says so in the sources' own words (the
// runtime shows the message in its pull error), not that the image is not pinned; what
// is not pinned says that.
func TestA404SaysWhy(t *testing.T) {
	img, src := newImage(t)
	d, _ := img.Digest()
	cause := errors.New("no node could send sha256:abc: peer 10.0.0.2:5001: not there")
	s := serve(t, failingSource{src, cause}, func(r string, dd digest.Digest) bool { return r == repo && dd.String() == d.String() })
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(s.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Errors []struct{ Code, Message string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Errors) != 1 {
			t.Fatalf("%s: %d, body %+v: %v", path, resp.StatusCode, body, err)
		}
		return resp.StatusCode, body.Errors[0].Code + ": " + body.Errors[0].Message
	}
	resp, err := http.Get(s.srv.URL + "/v2/" + repo + "/manifests/" + d.String())
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest: %v %v", resp, err)
	}
	resp.Body.Close()
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	code, msg := get("/v2/" + repo + "/blobs/" + ld.String())
	if code != http.StatusNotFound || !strings.Contains(msg, cause.Error()) || strings.Contains(msg, "not pinned") {
		t.Fatalf("a pinned blob that cannot be fetched: %d %q; want 404 naming %q", code, msg, cause)
	}
	other := digest.FromString("another image")
	if code, msg := get("/v2/" + repo + "/manifests/" + other.String()); code != http.StatusNotFound || msg != "MANIFEST_UNKNOWN: not a manifest pinned on this node, nor named by a manifest it serves" {
		t.Fatalf("a manifest not pinned: %d %q", code, msg)
	}
	if code, msg := get("/v2/" + repo + "/manifests/latest"); code != http.StatusNotFound || msg != "MANIFEST_UNKNOWN: tag latest is not pinned on this node" {
		t.Fatalf("a tag: %d %q", code, msg)
	}
}
