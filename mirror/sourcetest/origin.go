package sourcetest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
)

// Sending is how an origin sends blobs (and, Hangs, everything).
type Sending int

const (
	// Honest: each blob whole, its size announced.
	Honest Sending = iota
	// AnnouncesMore: the blob and extra bytes after it, announced (a Content-Length
	// larger than the descriptor's size).
	AnnouncesMore
	// AnnouncesLess: the blob but its last byte, announced (a smaller Content-Length).
	AnnouncesLess
	// StreamsOn: no size announced (chunked), the blob then bytes without end.
	StreamsOn
	// Stalls: the right size announced, the first half of the blob, then nothing
	// until the receiver goes away.
	Stalls
	// Hangs: no answer at all, to any request (manifests too), until the receiver goes
	// away.
	Hangs
)

func (s Sending) String() string {
	return [...]string{"honest", "announces more", "announces less", "streams on", "stalls", "hangs"}[s]
}

// extra is how many bytes past a blob AnnouncesMore sends.
const extra = 64 << 10

// Manifest is a manifest as an origin serves it.
type Manifest struct {
	Data      []byte
	MediaType string
}

// Blob is a blob a manifest names, with the size its descriptor gives.
type Blob struct {
	Digest digest.Digest
	Size   int64
}

// Origin is where a subject's source gets what it serves: a registry over TLS
// (go-containerregistry's, in process) holding one image and an index naming it, and
// sending as Sends says. The same content is open in memory (Manifest, Send) for a
// source with no registry behind it.
type Origin struct {
	// Host is the registry's host:port; CA its certificate.
	Host string
	CA   *x509.Certificate
	// Repo is the repository the source is asked for (Host + "/conformance/app").
	Repo string
	// Index is the pinned manifest (an OCI index); it names Image, which names Blobs
	// (the config, then the layers).
	Index, Image digest.Digest
	Blobs        []Blob
	// Missing is a manifest digest pinned like Index that the origin does not hold (an
	// image the registry lost, or not pushed yet).
	Missing   digest.Digest
	sending   atomic.Int32 // a Sending
	manifests map[digest.Digest]Manifest
	blobs     map[digest.Digest][]byte
	// gone ends every transfer still under way (the test is over).
	gone chan struct{}
	// dir holds the subject's files (TempDir): removed once the origin is.
	dir string
}

// newOrigin starts a registry holding a random image of three layers of about
// layerSize bytes and an index naming it, sending as s.
func newOrigin(t *testing.T, s Sending, layerSize int64) *Origin {
	t.Helper()
	// Made first, so removed last: after the origin's transfers ended (a subject's
	// stores may be written until they do).
	dir := t.TempDir()
	img, err := random.Image(layerSize, 3)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img})
	o := &Origin{manifests: map[digest.Digest]Manifest{}, blobs: map[digest.Digest][]byte{}, gone: make(chan struct{}),
		Missing: digest.FromString("a manifest the origin does not hold"), dir: dir}
	o.Index = o.addManifest(t, idx)
	o.Image = o.addManifest(t, img)
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	o.addBlob(cfg)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		o.addBlob(b)
	}

	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.serveHTTP(w, r, reg)
	}))
	// Cleanups run last first: the transfers still under way end, then the server
	// (whose Close waits for them) closes.
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(o.gone) })
	o.Host = strings.TrimPrefix(srv.URL, "https://")
	o.CA = srv.Certificate()
	o.Repo = o.Host + "/conformance/app"

	pool := x509.NewCertPool()
	pool.AddCert(o.CA)
	opt := remote.WithTransport(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}})
	ref, err := name.NewDigest(o.Repo + "@" + o.Index.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, opt); err != nil {
		t.Fatalf("push the index: %v", err)
	}
	// Pushed honestly; from now on it sends as s.
	o.sending.Store(int32(s))
	return o
}

func (o *Origin) addManifest(t *testing.T, m interface {
	RawManifest() ([]byte, error)
	MediaType() (types.MediaType, error)
}) digest.Digest {
	t.Helper()
	raw, err := m.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	mt, err := m.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromBytes(raw)
	o.manifests[d] = Manifest{Data: raw, MediaType: string(mt)}
	return d
}

func (o *Origin) addBlob(b []byte) {
	d := digest.FromBytes(b)
	o.blobs[d] = b
	o.Blobs = append(o.Blobs, Blob{d, int64(len(b))})
}

// Sends is how the origin sends.
func (o *Origin) Sends() Sending { return Sending(o.sending.Load()) }

// Pinned says whether repo@d is pinned: Index and Missing, in Repo.
func (o *Origin) Pinned(repo string, d digest.Digest) bool {
	return repo == o.Repo && (d == o.Index || d == o.Missing)
}

// Chain is the manifests above the image's blobs, nearest first.
func (o *Origin) Chain() []digest.Digest { return []digest.Digest{o.Image, o.Index} }

// Bytes is blob or manifest d as the origin holds it.
func (o *Origin) Bytes(d digest.Digest) []byte {
	if m, ok := o.manifests[d]; ok {
		return m.Data
	}
	return o.blobs[d]
}

// ErrUnknown is what the origin holds no such thing as.
var ErrUnknown = errors.New("unknown to the origin")

// Manifest is the manifest d as the origin sends it (Hangs: nothing until ctx ends).
func (o *Origin) Manifest(ctx context.Context, d digest.Digest) (Manifest, error) {
	if o.Sends() == Hangs {
		return Manifest{}, o.wait(ctx)
	}
	m, ok := o.manifests[d]
	if !ok {
		return Manifest{}, fmt.Errorf("manifest %s: %w", d, ErrUnknown)
	}
	return m, nil
}

// Send is the blob d as the origin sends it: a stream and the size it announces
// (-1: none). Its transfers end when ctx does.
func (o *Origin) Send(ctx context.Context, d digest.Digest) (io.ReadCloser, int64, error) {
	if o.Sends() == Hangs {
		return nil, 0, o.wait(ctx)
	}
	b, ok := o.blobs[d]
	if !ok {
		return nil, 0, fmt.Errorf("blob %s: %w", d, ErrUnknown)
	}
	n := int64(len(b))
	switch o.Sends() {
	case AnnouncesMore:
		return io.NopCloser(io.MultiReader(bytes.NewReader(b), bytes.NewReader(make([]byte, extra)))), n + extra, nil
	case AnnouncesLess:
		return io.NopCloser(bytes.NewReader(b[:n-1])), n - 1, nil
	case StreamsOn:
		return io.NopCloser(io.MultiReader(bytes.NewReader(b), &endless{o: o, ctx: ctx})), -1, nil
	case Stalls:
		return io.NopCloser(io.MultiReader(bytes.NewReader(b[:n/2]), &stalled{o: o, ctx: ctx})), n, nil
	}
	return io.NopCloser(bytes.NewReader(b)), n, nil
}

// wait blocks until ctx ends or the test is over.
func (o *Origin) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-o.gone:
		return errors.New("the origin is gone")
	}
}

// endless is bytes without end, until the receiver or the test goes.
type endless struct {
	o   *Origin
	ctx context.Context
}

func (e *endless) Read(p []byte) (int, error) {
	select {
	case <-e.ctx.Done():
		return 0, e.ctx.Err()
	case <-e.o.gone:
		return 0, errors.New("the origin is gone")
	default:
	}
	clear(p)
	return len(p), nil
}

// stalled sends nothing, until the receiver or the test goes.
type stalled struct {
	o   *Origin
	ctx context.Context
}

func (s *stalled) Read([]byte) (int, error) { return 0, s.o.wait(s.ctx) }

// serveHTTP is the registry as Sends says: go-containerregistry's registry, but
// for a Sending other than Honest the blobs' GETs (and, Hangs, every request) are the
// origin's own.
func (o *Origin) serveHTTP(w http.ResponseWriter, r *http.Request, reg http.Handler) {
	switch {
	case o.Sends() == Hangs:
		_ = o.wait(r.Context())
		return
	case o.Sends() == Honest || r.Method != http.MethodGet:
		reg.ServeHTTP(w, r)
		return
	}
	_, ref, ok := strings.Cut(r.URL.Path, "/blobs/")
	if !ok {
		reg.ServeHTTP(w, r)
		return
	}
	d, err := digest.Parse(ref)
	if err != nil {
		reg.ServeHTTP(w, r)
		return
	}
	body, n, err := o.Send(r.Context(), d)
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":%q}]}`, err.Error())
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", d.String())
	if n >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	}
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, 32<<10)
	for {
		k, err := body.Read(buf)
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		if err != nil {
			return
		}
	}
}

// CertsDir is a certs.d directory trusting the origin (<dir>/<Host>/ca.crt), as the
// node's registry access reads it.
func (o *Origin) CertsDir(t *testing.T) string {
	t.Helper()
	dir := o.TempDir(t)
	if err := os.MkdirAll(filepath.Join(dir, o.Host), 0o755); err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: o.CA.Raw})
	if err := os.WriteFile(filepath.Join(dir, o.Host, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TempDir is a new directory for the subject's files (a blob store): removed at the
// end of the test, after the origin's transfers ended (t.TempDir's may be removed
// before, while a fill still writes).
func (o *Origin) TempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(o.dir, "subject-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
