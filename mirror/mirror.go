// Package mirror is the node-local, read-only registry mirror of issue 24 (peers): it
// answers the OCI distribution API for the manifests and blobs of pinned images only
// (404 at once for anything else, so an unpinned pull goes on to its registry
// untouched), from the node's blob store, else from a Source (the registry through the
// node's own access, or a peer), streaming to the client while it writes the store.
//
// Paths carry the source repository whole: CRI-O is given the mirror as
// "127.0.0.1:PORT/<source prefix>", so a pull of quay.io/ns/app@sha256:… asks for
// /v2/quay.io/ns/app/manifests/sha256:…. Only digests are served (CRI-O's
// pull-from-mirror = "digest-only").
//
// Not yet wired into imagepind: the drop-in that points CRI-O at it, the peers and the
// status are the rest of issue 24.
package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
)

// Source fetches what the store lacks.
type Source interface {
	// Manifest is the manifest repo@d, as served (bytes and media type).
	Manifest(ctx context.Context, repo string, d digest.Digest) ([]byte, string, error)
	// Blob streams the blob d of repo, named by the manifest repo@manifest, and says its
	// size (-1: unknown).
	Blob(ctx context.Context, repo string, manifest, d digest.Digest) (io.ReadCloser, int64, error)
}

// Pinned says whether repo@d is the manifest of a pinned image (by its full name, as
// in the set: "quay.io/ns/app").
type Pinned func(repo string, d digest.Digest) bool

// Stats are the bytes served, by where they came from.
type Stats struct {
	FromStore, FromSource atomic.Int64
}

// Mirror is an http.Handler.
type Mirror struct {
	store  *blobstore.Store
	source Source
	pinned Pinned
	log    logrus.FieldLogger
	Stats  Stats

	mu sync.Mutex
	// children are the digests each served manifest names (config, layers, or the
	// manifests of an index), by repository, each to the manifest naming it: the blobs
	// the mirror may serve.
	children map[string]map[digest.Digest]digest.Digest
}

// New builds a mirror over store, filling it from source, serving what pinned allows.
func New(store *blobstore.Store, source Source, pinned Pinned, log logrus.FieldLogger) *Mirror {
	return &Mirror{store: store, source: source, pinned: pinned, log: log, children: map[string]map[digest.Digest]digest.Digest{}}
}

const mediaTypeLabel = "mediaType"

func (m *Mirror) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "read-only mirror", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
		w.WriteHeader(http.StatusOK)
		return
	}
	repo, kind, ref, ok := parsePath(r.URL.Path)
	if !ok {
		notFound(w, "NAME_UNKNOWN")
		return
	}
	d, err := digest.Parse(ref)
	if err != nil {
		notFound(w, "MANIFEST_UNKNOWN") // tags are not served (digest-only)
		return
	}
	switch kind {
	case "manifests":
		m.manifest(w, r, repo, d)
	case "blobs":
		m.blob(w, r, repo, d)
	}
}

// parsePath splits /v2/<name>/(manifests|blobs)/<ref>, the name being a source
// repository in the mirror's path form (PathFor).
func parsePath(p string) (repo, kind, ref string, ok bool) {
	rest, found := strings.CutPrefix(p, "/v2/")
	if !found {
		return "", "", "", false
	}
	for _, k := range []string{"/manifests/", "/blobs/"} {
		if i := strings.LastIndex(rest, k); i > 0 {
			return SourceRepo(rest[:i]), strings.Trim(k, "/"), rest[i+len(k):], true
		}
	}
	return "", "", "", false
}

// PathFor is how a source repository appears in the mirror's paths: a reference's path
// may not hold a port's colon, so "host:port/ns/app" is "host_port/ns/app" (a DNS name
// has no underscore). SourceRepo undoes it.
func PathFor(repo string) string {
	host, rest, _ := strings.Cut(repo, "/")
	return strings.Replace(host, ":", "_", 1) + "/" + rest
}

// SourceRepo is the source repository of a mirror path (PathFor's inverse).
func SourceRepo(path string) string {
	host, rest, _ := strings.Cut(path, "/")
	if i := strings.LastIndex(host, "_"); i > 0 {
		if _, err := strconv.Atoi(host[i+1:]); err == nil {
			host = host[:i] + ":" + host[i+1:]
		}
	}
	return host + "/" + rest
}

func notFound(w http.ResponseWriter, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, `{"errors":[{"code":%q,"message":"not pinned on this node"}]}`, code)
}

// parent is the served manifest that names blob d of repo, and whether there is one.
func (m *Mirror) parent(repo string, d digest.Digest) (digest.Digest, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.children[repo][d]
	return p, ok
}

func (m *Mirror) allowed(repo string, d digest.Digest) bool {
	_, ok := m.parent(repo, d)
	return ok
}

func (m *Mirror) manifest(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest) {
	if !m.pinned(repo, d) && !m.allowed(repo, d) {
		notFound(w, "MANIFEST_UNKNOWN")
		return
	}
	ctx := r.Context()
	var data []byte
	var mediaType string
	if rd, _, err := m.store.Reader(ctx, d); err == nil {
		data, err = io.ReadAll(rd)
		rd.Close()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		mediaType = sniffMediaType(data)
		m.Stats.FromStore.Add(int64(len(data)))
	} else {
		data, mediaType, err = m.source.Manifest(ctx, repo, d)
		if err != nil {
			m.log.WithError(err).WithField("manifest", repo+"@"+d.String()).Info("mirror: manifest not available")
			notFound(w, "MANIFEST_UNKNOWN")
			return
		}
		if digest.FromBytes(data) != d {
			// A source serving other bytes: the client goes on to its next endpoint.
			m.log.WithField("manifest", repo+"@"+d.String()).Warn("mirror: the source sent a manifest that does not match its digest")
			notFound(w, "MANIFEST_UNKNOWN")
			return
		}
		m.Stats.FromSource.Add(int64(len(data)))
		if sw, err := m.store.Writer(ctx, d, int64(len(data))); err == nil {
			if _, err := sw.Write(data); err == nil {
				_ = sw.Commit(ctx)
			}
			sw.Close()
		}
	}
	m.remember(repo, d, data)
	if mediaType == "" {
		mediaType = sniffMediaType(data)
	}
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", d.String())
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(data)
	}
}

// remember allows the blobs (or child manifests) a manifest names.
func (m *Mirror) remember(repo string, d digest.Digest, data []byte) {
	blobs, manifests, ok := named(data)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.children[repo]
	if c == nil {
		c = map[digest.Digest]digest.Digest{}
		m.children[repo] = c
	}
	for _, b := range append(blobs, manifests...) {
		c[b] = d
	}
}

// named is what a manifest names: the config and layers of an image manifest, the
// manifests of an index; ok false when data is not a manifest (a layer, a config).
func named(data []byte) (blobs, manifests []digest.Digest, ok bool) {
	var man struct {
		Config    *struct{ Digest digest.Digest }  `json:"config"`
		Layers    []struct{ Digest digest.Digest } `json:"layers"`
		Manifests []struct{ Digest digest.Digest } `json:"manifests"`
	}
	if json.Unmarshal(data, &man) != nil {
		return nil, nil, false
	}
	if man.Config != nil {
		blobs = append(blobs, man.Config.Digest)
	}
	for _, l := range man.Layers {
		blobs = append(blobs, l.Digest)
	}
	for _, l := range man.Manifests {
		manifests = append(manifests, l.Digest)
	}
	return blobs, manifests, true
}

// sniffMediaType is a manifest's mediaType field, else the OCI type its shape says.
func sniffMediaType(data []byte) string {
	var v struct {
		MediaType string          `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
	}
	_ = json.Unmarshal(data, &v)
	switch {
	case v.MediaType != "":
		return v.MediaType
	case v.Manifests != nil:
		return "application/vnd.oci.image.index.v1+json"
	}
	return "application/vnd.oci.image.manifest.v1+json"
}

func (m *Mirror) blob(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest) {
	manifest, ok := m.parent(repo, d)
	if !ok {
		notFound(w, "BLOB_UNKNOWN")
		return
	}
	ctx := r.Context()
	if rd, size, err := m.store.Reader(ctx, d); err == nil {
		defer rd.Close()
		w.Header().Set("Docker-Content-Digest", d.String())
		w.Header().Set("Content-Type", "application/octet-stream")
		n := size
		if r.Method == http.MethodHead {
			n = 0
		}
		m.Stats.FromStore.Add(n)
		http.ServeContent(w, r, "", zeroTime, rd)
		return
	}
	if r.Method == http.MethodHead {
		// Pulls GET their blobs; a HEAD for one not stored yet is not worth a fetch.
		notFound(w, "BLOB_UNKNOWN")
		return
	}
	body, size, err := m.source.Blob(ctx, repo, manifest, d)
	if err != nil {
		m.log.WithError(err).WithField("blob", repo+"@"+d.String()).Info("mirror: blob not available")
		notFound(w, "BLOB_UNKNOWN")
		return
	}
	defer body.Close()
	w.Header().Set("Docker-Content-Digest", d.String())
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	// Streamed to the client while written to the store, all but the last bytes: those
	// are sent only once the whole blob matches its digest, so a client never receives a
	// complete wrong blob (a source or peer serving garbage costs it a retry). Another
	// request filling the same blob: this one only streams.
	sw, err := m.store.Writer(ctx, d, size)
	if err != nil && !errors.Is(err, blobstore.ErrBusy) {
		m.log.WithError(err).Warn("mirror: blob store")
	}
	verifier := d.Verifier()
	held := &holdback{w: w, keep: 64 << 10}
	dst := io.MultiWriter(held, verifier)
	if sw != nil {
		dst = io.MultiWriter(held, verifier, sw)
	}
	w.WriteHeader(http.StatusOK)
	n, err := io.Copy(dst, body)
	m.Stats.FromSource.Add(n)
	if err == nil && !verifier.Verified() {
		err = fmt.Errorf("the source sent %d bytes that do not match %s", n, d)
	}
	if err == nil && sw != nil {
		err = sw.Commit(ctx)
	}
	if err != nil {
		if sw != nil {
			sw.Abandon(context.WithoutCancel(ctx), m.store)
		}
		m.log.WithError(err).WithField("blob", repo+"@"+d.String()).Warn("mirror: blob not served whole; the client's copy is cut")
		panic(http.ErrAbortHandler)
	}
	if sw != nil {
		sw.Close()
	}
	held.flush()
}

// holdback passes bytes on, keeping the last keep of them until flush.
type holdback struct {
	w    io.Writer
	buf  []byte
	keep int
}

func (h *holdback) Write(p []byte) (int, error) {
	h.buf = append(h.buf, p...)
	if over := len(h.buf) - h.keep; over > 0 {
		if _, err := h.w.Write(h.buf[:over]); err != nil {
			return 0, err
		}
		h.buf = append(h.buf[:0], h.buf[over:]...)
	}
	return len(p), nil
}

func (h *holdback) flush() { _, _ = h.w.Write(h.buf) }
