package registry

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/go-connections/tlsconfig"
	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/pkg/docker/config"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/pkg/tlsclientconfig"
	"go.podman.io/image/v5/types"
)

// Manifests are read over one connection per registry, not one per image:
// containers/image opens an image source for every image, and each source makes its own
// transport, connection (and TLS handshake) and ping. Here the Client keeps, per
// registry endpoint (host, certs.d directory, insecure), one transport pinged once, and
// reads each image's manifest on it, with the endpoints, TLS and credentials
// containers/image would use: the mirrors in registries.conf order
// (sysregistriesv2), the certs.d directory of the endpoint's host
// (tlsclientconfig.SetupCertificates), the credentials config.GetCredentialsForRef finds
// (the kubelet's for the image's own registry, never sent to a mirror elsewhere; the auth
// file's), and Basic or Bearer auth as the registry's ping asks.
//
// What this path does not do exactly as containers/image, it leaves to containers/image:
// any answer but a manifest or "not found" (which moves on to the next endpoint, as
// containers/image does), a ping that fails, an auth scheme other than Basic and Bearer,
// an identity token, a namespace proxy, a blocked registry, an additional layer store
// auth helper. Such an image is then read through containers/image's own image source,
// which gives the error it gives today (naming every endpoint tried).

// errShared says the shared path cannot read the image the way containers/image would:
// the caller reads it through containers/image.
var errShared = errors.New("not for the shared connection")

// endpointKey names one transport: what its TLS configuration is made of.
type endpointKey struct {
	host     string // host[:port] requests go to
	certDir  string // its certs.d directory
	insecure bool
}

// endpoint is one registry endpoint's transport, pinged once.
type endpoint struct {
	key    endpointKey
	client *http.Client

	mu       sync.Mutex
	pinged   bool
	pingErr  error
	pingedAt time.Time
	last     pingResult
	tokens   map[tokenKey]*bearer
}

// pingResult is what a ping found: the scheme that answered and the auth challenges.
type pingResult struct {
	scheme     string
	challenges []challenge
}

type challenge struct {
	scheme string // lower case
	params map[string]string
}

type tokenKey struct {
	realm, service, scope, user, pass string
}

type bearer struct {
	mu      sync.Mutex
	token   string
	expires time.Time
}

// sharedEndpoints are a Client's endpoints.
type sharedEndpoints struct {
	mu    sync.Mutex
	byKey map[endpointKey]*endpoint
	// pings counts the pings made (for tests).
	pings atomic.Int64
}

// pingRetry: a failed ping is not tried again for this long; the images asked meanwhile
// go to containers/image, whose error they get. pingAgain: a ping's answer (the scheme,
// the auth challenges) is taken for this long.
const (
	pingRetry = 5 * time.Second
	pingAgain = 5 * time.Minute
)

// get returns the endpoint of key, its transport made once (as containers/image makes
// each: tlsclientconfig.NewTransport, the certs.d directory's certificates), pinged.
func (s *sharedEndpoints) get(ctx context.Context, key endpointKey, userAgent string, width int) (e *endpoint, p pingResult, pinged bool, err error) {
	s.mu.Lock()
	e, ok := s.byKey[key]
	if !ok {
		tlsc := &tls.Config{CipherSuites: tlsconfig.ClientDefault().CipherSuites}
		if err := tlsclientconfig.SetupCertificates(key.certDir, tlsc); err != nil {
			s.mu.Unlock()
			return nil, pingResult{}, false, errShared
		}
		tlsc.InsecureSkipVerify = key.insecure
		tr := tlsclientconfig.NewTransport()
		tr.TLSClientConfig = tlsc
		// HTTP/2 where the registry offers it (one connection for every request in
		// flight); over HTTP/1.1, as many idle connections kept as sizings run at once.
		tr.ForceAttemptHTTP2 = true
		tr.MaxIdleConnsPerHost = width
		e = &endpoint{key: key, client: &http.Client{Transport: tr}, tokens: map[tokenKey]*bearer{}}
		if s.byKey == nil {
			s.byKey = map[endpointKey]*endpoint{}
		}
		s.byKey[key] = e
	}
	s.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if age := time.Since(e.pingedAt); e.pinged && ((e.pingErr == nil && age < pingAgain) || age < pingRetry) {
		return e, e.last, false, e.pingErr
	}
	s.pings.Add(1)
	e.pingErr = e.ping(ctx, userAgent)
	e.pinged, e.pingedAt = true, time.Now()
	return e, e.last, true, e.pingErr
}

// ping is containers/image's detectProperties: https, then http when the endpoint is
// insecure; 200 or 401, with the challenges the registry sends. For an insecure
// endpoint both are asked at once and https's answer is waited for: the same scheme is
// chosen (https whenever it answers), and a plain-http registry is known after one
// connection and one request, not a failed handshake first (two round trips fewer).
func (e *endpoint) ping(ctx context.Context, userAgent string) error {
	if !e.key.insecure {
		p, err := e.pingScheme(ctx, "https", userAgent)
		if err == nil {
			e.last = p
		}
		return err
	}
	type answer struct {
		p   pingResult
		err error
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	plain := make(chan answer, 1)
	go func() {
		p, err := e.pingScheme(hctx, "http", userAgent)
		plain <- answer{p, err}
	}()
	p, err := e.pingScheme(ctx, "https", userAgent)
	if err != nil {
		a := <-plain
		p, err = a.p, a.err
	}
	if err == nil {
		e.last = p
	}
	return err
}

// pingScheme asks scheme://host/v2/ as containers/image's ping does.
func (e *endpoint) pingScheme(ctx context.Context, scheme, userAgent string) (pingResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+e.key.host+"/v2/", nil)
	if err != nil {
		return pingResult{}, err
	}
	req.Header.Set("Docker-Distribution-API-Version", "registry/2.0")
	req.Header.Add("User-Agent", userAgent)
	res, err := e.client.Do(req)
	if err != nil {
		return pingResult{}, err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusUnauthorized {
		return pingResult{}, fmt.Errorf("ping %s: %s", e.key.host, res.Status)
	}
	chs, ok := parseChallenges(res.Header.Values("WWW-Authenticate"))
	if !ok {
		return pingResult{}, errShared
	}
	return pingResult{scheme: scheme, challenges: chs}, nil
}

// parseChallenges reads WWW-Authenticate headers of the form `Scheme k="v", k=v`; false
// for anything else (containers/image then reads it).
func parseChallenges(headers []string) ([]challenge, bool) {
	var out []challenge
	for _, h := range headers {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		scheme, rest, _ := strings.Cut(h, " ")
		c := challenge{scheme: strings.ToLower(scheme), params: map[string]string{}}
		rest = strings.TrimSpace(rest)
		for rest != "" {
			k, v, ok := strings.Cut(rest, "=")
			if !ok {
				return nil, false
			}
			k = strings.ToLower(strings.TrimSpace(k))
			v = strings.TrimSpace(v)
			if strings.HasPrefix(v, `"`) {
				end := strings.Index(v[1:], `"`)
				if end < 0 || strings.Contains(v[1:end+1], `\`) {
					return nil, false
				}
				c.params[k], rest = v[1:end+1], strings.TrimSpace(v[end+2:])
			} else {
				val, more, _ := strings.Cut(v, ",")
				c.params[k], rest = strings.TrimSpace(val), ","+more
				if more == "" {
					rest = ""
				}
			}
			rest = strings.TrimSpace(strings.TrimPrefix(rest, ","))
		}
		out = append(out, c)
	}
	return out, true
}

// sharedSource is an image at the endpoint that answered for it, read over that
// endpoint's shared transport.
type sharedSource struct {
	e         *endpoint
	ping      pingResult // the endpoint's ping, as it was when the source was opened
	repo      string     // the repository's path at the endpoint
	auth      types.DockerAuthConfig
	userAgent string
	tokens    int // token requests made
}

// openShared reads image's manifest as containers/image would (see above), over the
// shared transport of the endpoint that has it: the source, and the manifest and its
// type. errShared (or an error wrapping it) when containers/image must read it.
// took and requests are how long its requests took and how many (the ping when this
// call made it, a token, the manifest), for Client.recordTrip.
func (r *Client) openShared(ctx context.Context, image string, sys *types.SystemContext) (src *sharedSource, blob []byte, mime string, took time.Duration, requests int, err error) {
	if r.cfg.ConnectionPerImage || sys.DockerPerHostCertDirPath == "" || sys.DockerCertPath != "" {
		return nil, nil, "", 0, 0, errShared
	}
	if h, err := sysregistriesv2.AdditionalLayerStoreAuthHelper(sys); err != nil || h != "" {
		return nil, nil, "", 0, 0, errShared
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return nil, nil, "", 0, 0, errShared
	}
	if _, tagged := named.(reference.NamedTagged); tagged {
		if _, digested := named.(reference.Canonical); digested {
			return nil, nil, "", 0, 0, errShared // containers/image refuses both: its error
		}
	}
	named = reference.TagNameOnly(named)
	reg, err := sysregistriesv2.FindRegistry(sys, named.Name())
	if err != nil {
		return nil, nil, "", 0, 0, errShared
	}
	if reg == nil {
		reg = &sysregistriesv2.Registry{Endpoint: sysregistriesv2.Endpoint{Location: named.String()}, Prefix: named.String()}
	}
	sources, err := reg.PullSourcesFromReference(named)
	if err != nil {
		return nil, nil, "", 0, 0, errShared
	}
	for _, ps := range sources {
		if sys.DockerLogMirrorChoice {
			logrus.Infof("Trying to access %q", ps.Reference)
		} else {
			logrus.Debugf("Trying to access %q", ps.Reference)
		}
		var t time.Duration
		var n int
		src, blob, mime, t, n, err = r.attemptShared(ctx, sys, named, ps)
		took, requests = took+t, requests+n
		if errors.Is(err, errNotHere) {
			continue // containers/image moves on to the next endpoint too
		}
		if err != nil {
			return nil, nil, "", took, requests, err
		}
		return src, blob, mime, took, requests, nil
	}
	return nil, nil, "", 0, 0, errShared // none has it: containers/image says so, naming each
}

// errNotHere: the endpoint answered that it has no such manifest.
var errNotHere = fmt.Errorf("manifest unknown at this endpoint: %w", errShared)

func (r *Client) attemptShared(ctx context.Context, sys *types.SystemContext, logical reference.Named, ps sysregistriesv2.PullSource) (*sharedSource, []byte, string, time.Duration, int, error) {
	phys := reference.TagNameOnly(ps.Reference)
	if ps.Endpoint.NamespaceProxy != "" {
		return nil, nil, "", 0, 0, errShared
	}
	if preg, err := sysregistriesv2.FindRegistry(sys, phys.Name()); err != nil || (preg != nil && preg.Blocked) {
		return nil, nil, "", 0, 0, errShared
	}
	endpointSys := sys
	if sys.DockerAuthConfig != nil && reference.Domain(phys) != reference.Domain(logical) {
		c := *sys
		c.DockerAuthConfig, c.DockerBearerRegistryToken = nil, ""
		endpointSys = &c
	}
	if endpointSys.DockerBearerRegistryToken != "" {
		return nil, nil, "", 0, 0, errShared
	}
	auth, err := config.GetCredentialsForRef(endpointSys, phys)
	if err != nil || auth.IdentityToken != "" {
		return nil, nil, "", 0, 0, errShared
	}
	hostPort := reference.Domain(phys)
	host := hostPort
	if host == "docker.io" {
		host = "registry-1.docker.io"
	}
	key := endpointKey{host: host, certDir: filepath.Join(sys.DockerPerHostCertDirPath, hostPort), insecure: ps.Endpoint.Insecure}
	ua := sys.DockerRegistryUserAgent
	start := time.Now()
	e, ping, pinged, err := r.shared.get(ctx, key, ua, r.cfg.Concurrency)
	if err != nil {
		return nil, nil, "", 0, 0, fmt.Errorf("%w: %w", errShared, err)
	}
	if !pinged {
		start = time.Now() // not the wait for another sizing's ping
	}
	var tagOrDigest string
	switch ref := phys.(type) {
	case reference.Canonical:
		tagOrDigest = ref.Digest().String()
	case reference.NamedTagged:
		tagOrDigest = ref.Tag()
	default:
		return nil, nil, "", 0, 0, errShared
	}
	src := &sharedSource{e: e, ping: ping, repo: reference.Path(phys), auth: auth, userAgent: ua}
	blob, mime, err := src.manifest(ctx, tagOrDigest)
	took, requests := time.Since(start), 1+src.tokens
	if pinged {
		requests++
	}
	if err != nil {
		return nil, nil, "", took, requests, err
	}
	return src, blob, mime, took, requests, nil
}

// GetManifest reads the manifest instance (nil: none; the source's own was read by
// openShared) in the source's repository.
func (s *sharedSource) GetManifest(ctx context.Context, instance *digest.Digest) ([]byte, string, error) {
	if instance == nil {
		return nil, "", errShared
	}
	if err := instance.Validate(); err != nil {
		return nil, "", err
	}
	blob, mime, err := s.manifest(ctx, instance.String())
	if err != nil {
		return nil, "", fmt.Errorf("read manifest %s: %w", instance, err)
	}
	return blob, mime, nil
}

func (s *sharedSource) manifest(ctx context.Context, tagOrDigest string) ([]byte, string, error) {
	res, err := s.do(ctx, http.MethodGet, "/v2/"+s.repo+"/manifests/"+tagOrDigest, map[string][]string{"Accept": manifest.DefaultRequestedManifestMIMETypes})
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	switch res.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, "", errNotHere
	default:
		return nil, "", fmt.Errorf("%w: %s", errShared, res.Status)
	}
	const maxManifest = 4 << 20 // containers/image's iolimits.MaxManifestBodySize
	blob, err := io.ReadAll(io.LimitReader(res.Body, maxManifest+1))
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", errShared, err)
	}
	if len(blob) > maxManifest {
		return nil, "", errShared
	}
	mt := res.Header.Get("Content-Type")
	if t, _, err := mime.ParseMediaType(mt); err == nil {
		mt = t
	}
	return blob, mt, nil
}

// readRange reads n bytes of blob l at off (a Range request; a registry that answers
// with the whole blob is read up to them, as containers/image's GetBlobAt does).
func (s *sharedSource) readRange(ctx context.Context, l types.BlobInfo, off, n uint64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, rangeTimeout)
	defer cancel()
	if err := l.Digest.Validate(); err != nil {
		return nil, err
	}
	res, err := s.do(ctx, http.MethodGet, "/v2/"+s.repo+"/blobs/"+l.Digest.String(), map[string][]string{"Range": {fmt.Sprintf("bytes=%d-%d", off, off+n-1)}})
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body := io.Reader(res.Body)
	switch res.StatusCode {
	case http.StatusPartialContent:
	case http.StatusOK:
		if _, err := io.CopyN(io.Discard, body, int64(off)); err != nil {
			return nil, fmt.Errorf("range of %s: %w", l.Digest, err)
		}
	default:
		return nil, fmt.Errorf("range of %s: %s", l.Digest, res.Status)
	}
	data, err := io.ReadAll(io.LimitReader(body, int64(n)))
	if err != nil {
		return nil, err
	}
	if uint64(len(data)) != n {
		return nil, fmt.Errorf("range of %s: %d bytes, want %d", l.Digest, len(data), n)
	}
	return data, nil
}

// do sends a request to the endpoint with the auth its ping asked for (containers/image's
// setupRequestAuth: the first challenge it knows, Basic or Bearer).
func (s *sharedSource) do(ctx context.Context, method, path string, headers map[string][]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.ping.scheme+"://"+s.e.key.host+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Docker-Distribution-API-Version", "registry/2.0")
	for k, vs := range headers {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Add("User-Agent", s.userAgent)
	if len(s.ping.challenges) > 0 {
		done := false
		for _, c := range s.ping.challenges {
			switch c.scheme {
			case "basic":
				req.SetBasicAuth(s.auth.Username, s.auth.Password)
			case "bearer":
				token, err := s.token(ctx, c)
				if err != nil {
					return nil, err
				}
				req.Header.Set("Authorization", "Bearer "+token)
			default:
				continue
			}
			done = true
			break
		}
		if !done {
			return nil, errShared
		}
	}
	res, err := s.e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errShared, err)
	}
	return res, nil
}

// token is a bearer token for the source's repository (pull), cached per endpoint by
// realm, service, scope and credentials until it expires (containers/image's
// getBearerToken).
func (s *sharedSource) token(ctx context.Context, c challenge) (string, error) {
	realm := c.params["realm"]
	if realm == "" {
		return "", errShared
	}
	scope := "repository:" + s.repo + ":pull"
	key := tokenKey{realm: realm, service: c.params["service"], scope: scope, user: s.auth.Username, pass: s.auth.Password}
	s.e.mu.Lock()
	b, ok := s.e.tokens[key]
	if !ok {
		b = &bearer{}
		s.e.tokens[key] = b
	}
	s.e.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.token != "" && time.Now().Before(b.expires) {
		return b.token, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, realm, nil)
	if err != nil {
		return "", errShared
	}
	q := req.URL.Query()
	if s.auth.Username != "" {
		q.Add("account", s.auth.Username)
	}
	if key.service != "" {
		q.Add("service", key.service)
	}
	q.Add("scope", scope)
	req.URL.RawQuery = q.Encode()
	if s.auth.Username != "" && s.auth.Password != "" {
		req.SetBasicAuth(s.auth.Username, s.auth.Password)
	}
	req.Header.Add("User-Agent", s.userAgent)
	s.tokens++
	res, err := s.e.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errShared, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%w: token: %s", errShared, res.Status)
	}
	var t struct {
		Token       string    `json:"token"`
		AccessToken string    `json:"access_token"`
		ExpiresIn   int       `json:"expires_in"`
		IssuedAt    time.Time `json:"issued_at"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&t); err != nil {
		return "", fmt.Errorf("%w: token: %w", errShared, err)
	}
	if t.Token == "" {
		t.Token = t.AccessToken
	}
	if t.ExpiresIn < 60 {
		t.ExpiresIn = 60
	}
	if t.IssuedAt.IsZero() {
		t.IssuedAt = time.Now().UTC()
	}
	b.token, b.expires = t.Token, t.IssuedAt.Add(time.Duration(t.ExpiresIn)*time.Second)
	return b.token, nil
}
