package readauth

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/imagepin/imagepin/test/testcerts"
)

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

var secret = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.WriteString(w, "node names and registry errors")
})

// A fake API server over HTTP (the delegating clients post through the REST client):
// three known tokens; RBAC lets prometheus get /metrics only and the admin everything.
func fakeAPI(t *testing.T, reviews, checks *atomic.Int32) kubernetes.Interface {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		reviews.Add(1)
		var tr authnv1.TokenReview
		json.NewDecoder(r.Body).Decode(&tr)
		switch tr.Spec.Token {
		case "prometheus-token":
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:monitoring:prometheus"}}
		case "admin-token":
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "admin", Groups: []string{"system:masters"}}}
		case "nobody-token":
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:default:nobody"}}
		default:
			tr.Status = authnv1.TokenReviewStatus{Authenticated: false, Error: "invalid bearer token"}
		}
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(tr)
	})
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, r *http.Request) {
		checks.Add(1)
		var sar authzv1.SubjectAccessReview
		json.NewDecoder(r.Body).Decode(&sar)
		nr := sar.Spec.NonResourceAttributes
		switch {
		case nr == nil || nr.Verb != "get":
		case sar.Spec.User == "admin":
			sar.Status.Allowed = true
		case sar.Spec.User == "system:serviceaccount:monitoring:prometheus" && nr.Path == "/metrics":
			sar.Status.Allowed = true
		}
		sar.APIVersion, sar.Kind = "authorization.k8s.io/v1", "SubjectAccessReview"
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(sar)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func get(t *testing.T, h http.Handler, path, token string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

// With the API: no token and a bad token are 401, a token RBAC does not allow is 403, a
// token with RBAC gets in; the probes are open; answers are cached.
func TestTokensAndRBAC(t *testing.T) {
	var reviews, checks atomic.Int32
	g, err := New(Config{Kube: fakeAPI(t, &reviews, &checks), Open: []string{"/healthz", "/readyz"}, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Handler(secret)
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/v1/sets", "", http.StatusUnauthorized},
		{"/v1/sets", "stolen-or-made-up", http.StatusUnauthorized},
		{"/v1/sets", "nobody-token", http.StatusForbidden},
		{"/metrics", "nobody-token", http.StatusForbidden},
		{"/metrics", "prometheus-token", http.StatusOK},
		{"/v1/nodes", "prometheus-token", http.StatusForbidden},
		{"/v1/nodes", "admin-token", http.StatusOK},
		{"/", "admin-token", http.StatusOK},
		{"/healthz", "", http.StatusOK},
		{"/readyz", "", http.StatusOK},
	} {
		code, body := get(t, h, c.path, c.token)
		if code != c.want {
			t.Errorf("GET %s with %q: %d, want %d (%s)", c.path, c.token, code, c.want, body)
		}
		if code != http.StatusOK && strings.Contains(body, "registry errors") {
			t.Errorf("GET %s with %q leaked the body", c.path, c.token)
		}
		if code == http.StatusForbidden && !strings.Contains(body, "nonResourceURLs") {
			t.Errorf("a 403 must say how to grant access: %s", body)
		}
	}
	// Cached: the same token and path again ask the API nothing.
	r, c := reviews.Load(), checks.Load()
	for i := 0; i < 5; i++ {
		get(t, h, "/metrics", "prometheus-token")
		get(t, h, "/v1/sets", "nobody-token")
	}
	if reviews.Load() != r || checks.Load() != c {
		t.Fatalf("answers not cached: %d→%d token reviews, %d→%d access reviews", r, reviews.Load(), c, checks.Load())
	}
}

// Without the API: only a client certificate of the configured CA gets in.
func TestClientCertificatesWithoutTheAPI(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "read-ca")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.NewCA(dir, "other-ca")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{ClientCAFile: ca.File, Open: []string{"/healthz"}, Log: quiet()})
	if err != nil || !g.RequestsClientCerts {
		t.Fatalf("%v %v", err, g)
	}
	srv := httptest.NewUnstartedServer(g.Handler(secret))
	srv.TLS = &tlsConfigForTest
	srv.StartTLS()
	defer srv.Close()
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	try := func(clientPEM string) int {
		t.Helper()
		c, err := ca.HTTPClient(clientPEM)
		if err != nil {
			t.Fatal(err)
		}
		c.Transport.(*http.Transport).TLSClientConfig.RootCAs = pool
		resp, err := c.Get(srv.URL + "/v1/sets")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	good, _ := ca.Client(dir, "admin", "admin", "ops")
	bad, _ := other.Client(dir, "intruder", "admin", "ops")
	if code := try(""); code != http.StatusUnauthorized {
		t.Errorf("no certificate: %d", code)
	}
	if code := try(bad); code != http.StatusUnauthorized {
		t.Errorf("another CA's certificate: %d", code)
	}
	if code := try(good); code != http.StatusOK {
		t.Errorf("the CA's certificate: %d", code)
	}
	if _, err := New(Config{ClientCAFile: dir + "/missing.crt"}); err == nil {
		t.Error("a missing CA file is accepted")
	}
}

// With neither the API nor a CA every request passes (the caller binds to loopback).
func TestNeitherLetsEveryoneIn(t *testing.T) {
	g, err := New(Config{Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, g.Handler(secret), "/v1/sets", ""); code != http.StatusOK {
		t.Fatalf("%d", code)
	}
}

// tlsConfigForTest asks for client certificates without verifying them at the TLS
// layer, as the aggregator's read listener does (aggregator.ReadTLS): the gate checks.
var tlsConfigForTest = tls.Config{ClientAuth: tls.RequestClientCert}
