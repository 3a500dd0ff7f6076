// Package registrytest is a registry for tests: go-containerregistry's registry over TLS,
// with basic auth per namespace, counting requests.
package registrytest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is a TLS registry that lives as long as the test.
type Registry struct {
	t   *testing.T
	srv *httptest.Server
	// Host is host:port.
	Host     string
	requests atomic.Int64
	// pings and conns count the pings (GET /v2/) and the connections accepted.
	pings, conns atomic.Int64
	// delay is how long each request waits before it is served (a far registry).
	delay                 atomic.Int64
	inFlight, maxInFlight atomic.Int64
	// users maps a namespace ("" for the ping and any path) to user:password.
	users map[string]string
}

// New starts a registry. With users set, each namespace needs its user:password and a
// repository outside every namespace is refused.
func New(t *testing.T, users map[string]string) *Registry {
	t.Helper()
	return start(t, users, true)
}

// NewPlain starts a registry serving plain HTTP (one listed insecure in
// registries.conf); Push works on it as on New's.
func NewPlain(t *testing.T, users map[string]string) *Registry {
	t.Helper()
	return start(t, users, false)
}

func start(t *testing.T, users map[string]string, withTLS bool) *Registry {
	t.Helper()
	r := &Registry{t: t, users: users}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		if req.URL.Path == "/v2/" {
			r.pings.Add(1)
		}
		n := r.inFlight.Add(1)
		defer r.inFlight.Add(-1)
		for m := r.maxInFlight.Load(); n > m && !r.maxInFlight.CompareAndSwap(m, n); m = r.maxInFlight.Load() {
		}
		time.Sleep(time.Duration(r.delay.Load()))
		if r.users != nil && !r.authorized(req) {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, req)
	}))
	r.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			r.conns.Add(1)
		}
	}
	r.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes a test provokes
	if withTLS {
		// HTTP/2 for the clients that ask for it, as a registry serving TLS offers.
		r.srv.EnableHTTP2 = true
		r.srv.StartTLS()
	} else {
		r.srv.Start()
	}
	t.Cleanup(r.srv.Close)
	r.Host = strings.TrimPrefix(strings.TrimPrefix(r.srv.URL, "https://"), "http://")
	return r
}

// Requests is how many requests reached the registry.
func (r *Registry) Requests() int64 { return r.requests.Load() }

// Pings is how many pings (GET /v2/) reached the registry.
func (r *Registry) Pings() int64 { return r.pings.Load() }

// Connections is how many connections the registry accepted.
func (r *Registry) Connections() int64 { return r.conns.Load() }

// SetDelay makes every request from now on wait d before it is served.
func (r *Registry) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// MaxInFlight is the most requests the registry served at once, since the last call.
func (r *Registry) MaxInFlight() int64 { return r.maxInFlight.Swap(0) }

func (r *Registry) authorized(req *http.Request) bool {
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

// WriteCA puts the registry's certificate into certsDir/<host>/ca.crt.
func (r *Registry) WriteCA(certsDir string) {
	r.t.Helper()
	dir := filepath.Join(certsDir, r.Host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), pemBytes, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *Registry) options(user string) []remote.Option {
	pool := x509.NewCertPool()
	if c := r.srv.Certificate(); c != nil {
		pool.AddCert(c)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	opts := []remote.Option{remote.WithTransport(tr)}
	if user != "" {
		u, p, _ := strings.Cut(user, ":")
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: u, Password: p}))
	}
	return opts
}

// Push writes img as repo, by digest and under each tag, as user ("" for none), and
// returns "repo@sha256:…".
func (r *Registry) Push(repo string, img v1.Image, user string, tags ...string) string {
	r.t.Helper()
	d, _ := img.Digest()
	return r.put(repo, d, tags, func(ref name.Reference) error { return remote.Write(ref, img, r.options(user)...) })
}

// PushIndex writes idx like Push.
func (r *Registry) PushIndex(repo string, idx v1.ImageIndex, user string, tags ...string) string {
	r.t.Helper()
	d, _ := idx.Digest()
	return r.put(repo, d, tags, func(ref name.Reference) error { return remote.WriteIndex(ref, idx, r.options(user)...) })
}

func (r *Registry) put(repo string, d v1.Hash, tags []string, write func(name.Reference) error) string {
	r.t.Helper()
	for _, suffix := range append([]string{"@" + d.String()}, prefixed(":", tags)...) {
		ref, err := name.ParseReference(r.Host + "/" + repo + suffix)
		if err != nil {
			r.t.Fatal(err)
		}
		if err := write(ref); err != nil {
			r.t.Fatal(err)
		}
	}
	return repo + "@" + d.String()
}

func prefixed(p string, ss []string) []string {
	var out []string
	for _, s := range ss {
		out = append(out, p+s)
	}
	return out
}
