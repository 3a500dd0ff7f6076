package diskcheck

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepin/imagepin/cri"
)

// testRegistry is go-containerregistry's registry over TLS, with basic auth per
// namespace when users is set, counting requests.
type testRegistry struct {
	t        *testing.T
	srv      *httptest.Server
	host     string
	requests atomic.Int64
	// users maps a namespace ("" for the ping and any path) to user:password.
	users map[string]string
}

func newTestRegistry(t *testing.T, users map[string]string) *testRegistry {
	t.Helper()
	r := &testRegistry{t: t, users: users}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		if r.users != nil && !r.authorized(req) {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "https://")
	return r
}

func (r *testRegistry) authorized(req *http.Request) bool {
	user, pass, ok := req.BasicAuth()
	if !ok {
		return false
	}
	path := strings.TrimPrefix(req.URL.Path, "/v2/")
	want, scoped := "", false
	for ns, up := range r.users {
		if ns != "" && strings.HasPrefix(path, ns+"/") {
			want, scoped = up, true
		}
	}
	if !scoped {
		if path != "" {
			// A repository outside every namespace: refuse.
			return false
		}
		// The ping: any known user.
		for _, up := range r.users {
			if up == user+":"+pass {
				return true
			}
		}
		return false
	}
	return want == user+":"+pass
}

// writeCA puts the registry's certificate into certsDir/<host>/ca.crt.
func (r *testRegistry) writeCA(certsDir string) {
	r.t.Helper()
	dir := filepath.Join(certsDir, r.host)
	os.MkdirAll(dir, 0o755)
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), pemBytes, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *testRegistry) options(user string) []remote.Option {
	pool := x509.NewCertPool()
	pool.AddCert(r.srv.Certificate())
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	opts := []remote.Option{remote.WithTransport(tr)}
	if user != "" {
		u, p, _ := strings.Cut(user, ":")
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: u, Password: p}))
	}
	return opts
}

func (r *testRegistry) push(repo string, img v1.Image, user string) string {
	r.t.Helper()
	d, _ := img.Digest()
	ref, _ := name.ParseReference(r.host + "/" + repo + "@" + d.String())
	if err := remote.Write(ref, img, r.options(user)...); err != nil {
		r.t.Fatal(err)
	}
	return repo + "@" + d.String()
}

func (r *testRegistry) pushIndex(repo string, idx v1.ImageIndex) string {
	r.t.Helper()
	d, _ := idx.Digest()
	ref, err := name.ParseReference(r.host + "/" + repo + "@" + d.String())
	if err != nil {
		r.t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, r.options("")...); err != nil {
		r.t.Fatal(err)
	}
	return repo + "@" + d.String()
}

func layer(t *testing.T, size int64) v1.Layer {
	t.Helper()
	l, err := random.Layer(size, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func image(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func layerBytes(t *testing.T, ls ...v1.Layer) uint64 {
	var n uint64
	for _, l := range ls {
		s, err := l.Size()
		if err != nil {
			t.Fatal(err)
		}
		n += uint64(s)
	}
	return n
}

type files struct {
	dir, conf, confDir, certs string
}

func newFiles(t *testing.T, registriesConf string) files {
	dir := t.TempDir()
	f := files{dir: dir, conf: filepath.Join(dir, "registries.conf"), confDir: filepath.Join(dir, "registries.conf.d"), certs: filepath.Join(dir, "certs.d")}
	os.MkdirAll(f.confDir, 0o755)
	os.MkdirAll(f.certs, 0o755)
	if err := os.WriteFile(f.conf, []byte(registriesConf), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f files) resolver(p Platform, creds Credentials) *Resolver {
	if p.OS == "" {
		p = Platform{OS: "linux", Architecture: "amd64"}
	}
	return NewResolver(ResolverConfig{RegistriesConf: f.conf, RegistriesConfDir: f.confDir, CertsDir: f.certs, Platform: p, Concurrency: 4}, creds)
}

// A disconnected cluster: the source does not exist, only its digest mirror answers,
// over TLS trusted through certs.d.
func TestMirrorOnlySourceWithCertsDir(t *testing.T) {
	reg := newTestRegistry(t, nil)
	l1, l2 := layer(t, 3000), layer(t, 5000)
	repoDigest := reg.push("ocp/release", image(t, l1, l2), "")
	digest := strings.SplitN(repoDigest, "@", 2)[1]
	f := newFiles(t, fmt.Sprintf(`[[registry]]
prefix = "upstream.example.invalid/ocp"
location = "upstream.example.invalid/ocp"
[[registry.mirror]]
location = %q
pull-from-mirror = "digest-only"
`, reg.host+"/ocp"))
	src := "upstream.example.invalid/ocp/release@" + digest

	// Without the CA the mirror's TLS fails and the source does not resolve: an error
	// listing both endpoints, transient (it may be fixed by itself: not Unavailable).
	_, err := f.resolver(Platform{}, nil).Resolve(context.Background(), src)
	if err == nil || IsUnavailable(err) || !strings.Contains(err.Error(), reg.host) || !strings.Contains(err.Error(), "upstream.example.invalid") {
		t.Fatalf("without the CA: %v", err)
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("the TLS failure should be named: %v", err)
	}

	reg.writeCA(f.certs)
	img, err := f.resolver(Platform{}, nil).Resolve(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if img.Bytes() != layerBytes(t, l1, l2) || len(img.Layers) != 2 {
		t.Fatalf("sized %d bytes in %d layers, want %d in 2", img.Bytes(), len(img.Layers), layerBytes(t, l1, l2))
	}

	// A digest-only mirror is not asked for a tag: only the (missing) source is.
	_, err = f.resolver(Platform{}, nil).Resolve(context.Background(), "upstream.example.invalid/ocp/release:latest")
	if err == nil || strings.Contains(err.Error(), reg.host) {
		t.Fatalf("a tag must not go to a digest-only mirror: %v", err)
	}
}

// Credentials keyed by namespace, as the kubelet matches them.
func TestCredentialsByNamespace(t *testing.T) {
	reg := newTestRegistry(t, map[string]string{"team-a": "alice:apass", "team-b": "bob:bpass"})
	a := reg.push("team-a/app", image(t, layer(t, 1000)), "alice:apass")
	b := reg.push("team-b/app", image(t, layer(t, 2000)), "bob:bpass")
	f := newFiles(t, "")
	reg.writeCA(f.certs)
	secret := fmt.Sprintf(`{"auths": {%q: {"username": "alice", "password": "apass"}, %q: {"username": "bob", "password": "bpass"}, %q: {"username": "nobody", "password": "x"}}}`,
		reg.host+"/team-a", reg.host+"/team-b", reg.host)
	k, err := cri.ParseKeyring([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	r := f.resolver(Platform{}, k.Lookup)
	for _, ref := range []string{a, b} {
		if _, err := r.Resolve(context.Background(), reg.host+"/"+ref); err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
	}
	// Without credentials: access denied is permanent.
	_, err = f.resolver(Platform{}, nil).Resolve(context.Background(), reg.host+"/"+a)
	if !IsUnavailable(err) {
		t.Fatalf("no credentials: %v (unavailable %v)", err, IsUnavailable(err))
	}
}

// An OCI index and a Docker manifest list resolve per platform; a platform the list
// lacks is Unavailable, naming the platforms it has.
func TestManifestListsPerPlatform(t *testing.T) {
	reg := newTestRegistry(t, nil)
	f := newFiles(t, "")
	reg.writeCA(f.certs)
	amdL, armL := layer(t, 4000), layer(t, 7000)
	amd, arm := image(t, amdL), image(t, armL)
	for _, kind := range []types.MediaType{types.OCIImageIndex, types.DockerManifestList} {
		idx := mutate.AppendManifests(empty.Index,
			mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
			mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}}},
		)
		idx = mutate.IndexMediaType(idx, kind)
		repo := map[types.MediaType]string{types.OCIImageIndex: "multi/oci", types.DockerManifestList: "multi/docker"}[kind]
		ref := reg.host + "/" + reg.pushIndex(repo, idx)
		for p, want := range map[Platform]uint64{
			{OS: "linux", Architecture: "amd64"}:                layerBytes(t, amdL),
			{OS: "linux", Architecture: "arm64", Variant: "v8"}: layerBytes(t, armL),
		} {
			img, err := f.resolver(p, nil).Resolve(context.Background(), ref)
			if err != nil || img.Bytes() != want {
				t.Fatalf("%s for %s: %d bytes, %v; want %d", kind, p, img.Bytes(), err, want)
			}
		}
		_, err := f.resolver(Platform{OS: "linux", Architecture: "s390x"}, nil).Resolve(context.Background(), ref)
		if !IsUnavailable(err) || !strings.Contains(err.Error(), "has no manifest for linux/s390x") ||
			!strings.Contains(err.Error(), "linux/amd64, linux/arm64/v8") || !strings.Contains(err.Error(), ref) {
			t.Fatalf("%s for s390x: %v", kind, err)
		}
	}
}

// The cache makes a second check free: no request reaches the registry.
func TestResolverCachesByDigest(t *testing.T) {
	reg := newTestRegistry(t, nil)
	f := newFiles(t, "")
	reg.writeCA(f.certs)
	ref := reg.host + "/" + reg.push("c/app", image(t, layer(t, 100)), "")
	r := f.resolver(Platform{}, nil)
	if _, err := r.Resolve(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	before := reg.requests.Load()
	if _, err := r.Resolve(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	if after := reg.requests.Load(); after != before {
		t.Fatalf("a cached image cost %d requests", after-before)
	}
	t.Logf("one image cold: %d requests (ping, manifest)", before)
}
