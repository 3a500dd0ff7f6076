package registry

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/pullcreds"
	"github.com/imagepin/imagepin/test/registrytest"
)

// layersAll reads every image's manifest at once, as the disk check does.
func layersAll(t *testing.T, r *Client, images []string) map[string]Image {
	t.Helper()
	out := map[string]Image{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, image := range images {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := r.Layers(context.Background(), image)
			if err != nil {
				t.Errorf("%s: %v", image, err)
			}
			mu.Lock()
			out[image] = img
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// Many images of one registry are read over one connection with one ping, not a
// connection and a ping each as containers/image's image sources make; with the
// registry's Basic auth and the kubelet's credentials per namespace, and their
// uncompressed sizes (Range requests) on the same connection.
func TestManifestsShareOneConnectionAndPingPerRegistry(t *testing.T) {
	const n = 100
	reg := registrytest.New(t, map[string]string{"team": "alice:apass"})
	f := newFiles(t, "")
	reg.WriteCA(f.Certs)
	var images []string
	want := map[string]uint64{}
	for i := range n {
		l := layer(t, 2000)
		ref := reg.Host + "/" + reg.Push(fmt.Sprintf("team/app-%03d", i), image(t, l), "alice:apass")
		images = append(images, ref)
		want[ref] = layerBytes(t, l)
	}
	k, err := pullcreds.ParseKeyring([]byte(fmt.Sprintf(`{"auths": {%q: {"username": "alice", "password": "apass"}}}`, reg.Host+"/team")))
	if err != nil {
		t.Fatal(err)
	}
	pings, conns := reg.Pings(), reg.Connections()
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, Platform: Platform{OS: "linux", Architecture: "amd64"}}, k.Lookup)
	for image, img := range layersAll(t, r, images) {
		if img.Bytes() != want[image] {
			t.Fatalf("%s: %d bytes, want %d", image, img.Bytes(), want[image])
		}
	}
	// Their uncompressed sizes, on the sources the manifests were read on.
	imgs, errs := resolveAll(r, images...)
	for _, image := range images {
		if errs[image] != nil || imgs[image].Layers[0].Uncompressed <= 0 {
			t.Fatalf("%s: %+v %v", image, imgs[image], errs[image])
		}
	}
	if got := reg.Pings() - pings; got != 1 {
		t.Fatalf("%d images: %d pings, want 1", n, got)
	}
	if got := reg.Connections() - conns; got > 2 {
		t.Fatalf("%d images: %d connections, want 1 (2 at most)", n, got)
	}
	if r.RangeRequests() < n {
		t.Fatalf("%d Range requests for %d layers", r.RangeRequests(), n)
	}
	// Without the credentials: what containers/image says, permanent.
	_, err = resolver(f, Platform{}, nil).Layers(context.Background(), images[0])
	if !IsUnavailable(err) || !strings.Contains(err.Error(), "unauthorized") {
		t.Fatalf("no credentials: %v (unavailable %v)", err, IsUnavailable(err))
	}
}

// A registry behind Bearer tokens (quay.io, Docker Hub, a distribution registry with a
// token service): one ping for all, a token per repository asked with the kubelet's
// credentials (as containers/image asks it) and kept until it expires, the manifests
// and Range requests sent with it.
func TestSharedConnectionWithBearerTokens(t *testing.T) {
	const n = 20
	var pings, tokens atomic.Int64
	reg := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	var srv *httptest.Server
	srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch {
		case req.URL.Path == "/token":
			tokens.Add(1)
			tok := "anonymous"
			if u, p, ok := req.BasicAuth(); ok && u == "alice" && p == "apass" && req.URL.Query().Get("account") == "alice" && req.URL.Query().Get("service") == "test" {
				tok = "tok-" + req.URL.Query().Get("scope")
			}
			fmt.Fprintf(w, `{"token": %q, "expires_in": 300}`, tok)
			return
		case req.URL.Path == "/v2/":
			pings.Add(1)
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="%s/token",service="test"`, srv.URL))
			w.WriteHeader(http.StatusUnauthorized)
			return
		case req.Method == http.MethodGet:
			repo, _, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/v2/"), "/manifests/")
			repo, _, _ = strings.Cut(repo, "/blobs/")
			if req.Header.Get("Authorization") != "Bearer tok-repository:"+repo+":pull" {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="%s/token",service="test",scope="repository:%s:pull"`, srv.URL, repo))
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "https://")
	f := newFiles(t, "")
	os.MkdirAll(filepath.Join(f.Certs, host), 0o755)
	os.WriteFile(filepath.Join(f.Certs, host, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	var images []string
	for i := range n {
		img := image(t, layer(t, 2000))
		ref, err := name.ParseReference(fmt.Sprintf("%s/team/app-%02d", host, i))
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img, remote.WithTransport(srv.Client().Transport)); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		images = append(images, ref.Context().Name()+"@"+d.String())
	}
	k, err := pullcreds.ParseKeyring([]byte(fmt.Sprintf(`{"auths": {%q: {"username": "alice", "password": "apass"}}}`, host)))
	if err != nil {
		t.Fatal(err)
	}
	pings.Store(0)
	tokens.Store(0)
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, Platform: Platform{OS: "linux", Architecture: "amd64"}}, k.Lookup)
	layersAll(t, r, images)
	imgs, errs := resolveAll(r, images...)
	for _, image := range images {
		if errs[image] != nil || imgs[image].Layers[0].Uncompressed <= 0 {
			t.Fatalf("%s: %+v %v", image, imgs[image], errs[image])
		}
	}
	if got := pings.Load(); got != 1 {
		t.Fatalf("%d images: %d pings, want 1", n, got)
	}
	if got := tokens.Load(); got != n {
		t.Fatalf("%d images: %d token requests, want one per repository", n, got)
	}
	// Without the credentials: the registry's refusal, permanent, in containers/image's words.
	_, err = New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, Platform: Platform{OS: "linux", Architecture: "amd64"}}, nil).Layers(context.Background(), images[0])
	if !IsUnavailable(err) {
		t.Fatalf("no credentials: %v (unavailable %v)", err, IsUnavailable(err))
	}
}

// Mirrors over the shared connection: each image from the first endpoint in
// registries.conf order that has it, as containers/image picks it (the mirror, else the
// source), named in its "Trying to access" lines for EndpointRecorder; one ping for the
// host both live on.
func TestSharedConnectionTriesMirrorsInOrder(t *testing.T) {
	reg := registrytest.New(t, nil)
	var images []string
	want := map[string]string{}
	for i := range 6 {
		img := image(t, layer(t, 1000))
		ref := reg.Push(fmt.Sprintf("app/x%d", i), img, "")
		repo, d, _ := strings.Cut(ref, "@")
		endpoint := reg.Host + "/" + repo
		if i%2 == 0 {
			reg.Push(fmt.Sprintf("mirror/x%d", i), img, "")
			endpoint = reg.Host + "/mirror/x" + fmt.Sprint(i)
		}
		images = append(images, "upstream.example.invalid/app/x"+fmt.Sprint(i)+"@"+d)
		want[images[len(images)-1]] = endpoint
	}
	f := newFiles(t, fmt.Sprintf("[[registry]]\nprefix = \"upstream.example.invalid/app\"\nlocation = %q\n[[registry.mirror]]\nlocation = %q\n", reg.Host+"/app", reg.Host+"/mirror"))
	reg.WriteCA(f.Certs)
	rec := NewEndpointRecorder()
	logrus.AddHook(rec)
	pings := reg.Pings()
	r := New(Config{RegistriesConf: f.Conf, RegistriesConfDir: f.ConfDir, CertsDir: f.Certs, Platform: Platform{OS: "linux", Architecture: "amd64"}, LogEndpoints: true}, nil)
	layersAll(t, r, images)
	for _, image := range images {
		if got := rec.Endpoint(image); got != want[image] {
			t.Errorf("%s: served by %q, want %q", image, got, want[image])
		}
	}
	if got := reg.Pings() - pings; got != 1 {
		t.Fatalf("%d pings, want 1", got)
	}
	// An image neither has: containers/image's error, naming both endpoints.
	_, err := r.Layers(context.Background(), "upstream.example.invalid/app/none@sha256:"+strings.Repeat("0", 64))
	if !IsUnavailable(err) || !strings.Contains(err.Error(), reg.Host+"/mirror/none") || !strings.Contains(err.Error(), reg.Host+"/app/none") {
		t.Fatalf("neither has it: %v", err)
	}
}

// The ping of an endpoint listed insecure asks https and http at once and picks the
// scheme containers/image would: https whenever it answers, http for a plain registry.
// An endpoint not listed insecure is never asked over http.
func TestInsecurePingPicksTheSchemeContainersImageWould(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tls      bool
		insecure bool
		ok       bool
	}{
		{"plain registry, insecure", false, true, true},
		{"TLS registry, insecure", true, true, true},
		{"plain registry, not insecure", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := registrytest.NewPlain(t, nil)
			if tc.tls {
				reg = registrytest.New(t, nil)
			}
			ref := reg.Host + "/" + reg.Push("team/app", image(t, layer(t, 2000)), "")
			conf := ""
			if tc.insecure {
				conf = fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", reg.Host)
			}
			f := newFiles(t, conf)
			if tc.tls {
				reg.WriteCA(f.Certs)
			}
			pings := reg.Pings()
			r := resolver(f, Platform{}, nil)
			img, err := r.Layers(context.Background(), ref)
			if ok := err == nil && len(img.Layers) == 1; ok != tc.ok {
				t.Fatalf("read %s: %+v %v, want success %v", ref, img, err, tc.ok)
			}
			if !tc.ok {
				return
			}
			// One ping reached the registry's handler: over TLS for the TLS registry
			// (the plain request to its port is refused before it), the plain one for
			// the plain registry.
			if got := reg.Pings() - pings; got != 1 {
				t.Fatalf("%d pings reached the registry, want 1", got)
			}
			scheme := ""
			for _, e := range r.shared.byKey {
				scheme = e.last.scheme
			}
			want := map[bool]string{true: "https", false: "http"}[tc.tls]
			if scheme != want {
				t.Fatalf("scheme %q, want %q", scheme, want)
			}
		})
	}
}

// An endpoint listed insecure where nothing listens fails both pings: the image is not
// read, and the error names the endpoint (containers/image's, from its own image
// source, as for any failed ping).
func TestInsecurePingWithNothingListening(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	f := newFiles(t, fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", host))
	ref := host + "/team/app@sha256:" + strings.Repeat("1", 64)
	_, err = resolver(f, Platform{}, nil).Layers(context.Background(), ref)
	if err == nil || !strings.Contains(err.Error(), host) {
		t.Fatalf("read %s with nothing listening: %v", ref, err)
	}
}
