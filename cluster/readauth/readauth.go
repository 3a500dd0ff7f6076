// Package readauth decides who may read the aggregator's read side (the status page,
// /v1/…, /metrics): node names, image references, registry errors and faults are for
// the cluster's administrators and its monitoring, not for anyone who reaches a port.
//
// With the Kubernetes API it authenticates and authorizes the Kubernetes way, through
// the delegated authentication and authorization of k8s.io/apiserver, as kube-rbac-proxy
// and controller-runtime's metrics server do: a bearer token is checked with a
// TokenReview (and a client certificate of ClientCAFile, when set, by its chain), and
// access with a SubjectAccessReview of the non-resource URL: verb get, the request's
// path. So Prometheus with its service account and an admin with kubectl's credentials
// get in when RBAC lets them (nonResourceURLs: ["/metrics"], ["/v1/*", "/"]), and nobody
// else does. Answers are cached (tokens 2 min, allowed 5 min, denied 30 s).
//
// Without the API, a client certificate of ClientCAFile is the only way in, and any such
// certificate may read; with neither, every request passes: the caller binds the
// listener to loopback (imagepin-aggregator refuses another address then).
//
// Open paths (the probes' /healthz and /readyz) pass without either.
package readauth

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
)

// Config says how readers prove who they are.
type Config struct {
	// Kube asks the API server (TokenReview, SubjectAccessReview); nil: no API.
	Kube kubernetes.Interface
	// ClientCAFile, when set, lets clients in by a certificate it signed (the user is the
	// subject's CN, the groups its O).
	ClientCAFile string
	// Open are paths served to anyone (the probes).
	Open []string
	Log  logrus.FieldLogger
}

// Cache lifetimes of the API's answers, as controller-runtime's metrics server has them.
const (
	TokenCacheTTL = 2 * time.Minute
	AllowCacheTTL = 5 * time.Minute
	DenyCacheTTL  = 30 * time.Second
)

// Guard is the read side's gate.
type Guard struct {
	authn authenticator.Request // nil: everyone (loopback only)
	authz authorizer.Authorizer // nil: every authenticated reader
	open  map[string]bool
	// RequestsClientCerts says whether the TLS listener must ask for client certificates.
	RequestsClientCerts bool
	log                 logrus.FieldLogger
}

// New builds the gate. It errs only on a ClientCAFile that cannot be read.
func New(cfg Config) (*Guard, error) {
	g := &Guard{open: map[string]bool{}, log: cfg.Log}
	for _, p := range cfg.Open {
		g.open[p] = true
	}
	var ca dynamiccertificates.CAContentProvider
	if cfg.ClientCAFile != "" {
		pem, err := os.ReadFile(cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read side client CA: %w", err)
		}
		if ca, err = dynamiccertificates.NewStaticCAContent("read-client-ca", pem); err != nil {
			return nil, fmt.Errorf("read side client CA %s: %w", cfg.ClientCAFile, err)
		}
		g.RequestsClientCerts = true
	}
	if cfg.Kube == nil && ca == nil {
		return g, nil
	}
	// A webhook call that fails is retried a few times, briefly: the API server being
	// down must not hold readers for long.
	backoff := &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	ac := authenticatorfactory.DelegatingAuthenticatorConfig{
		CacheTTL:                           TokenCacheTTL,
		WebhookRetryBackoff:                backoff,
		TokenAccessReviewTimeout:           10 * time.Second,
		ClientCertificateCAContentProvider: ca,
	}
	if cfg.Kube != nil {
		ac.TokenAccessReviewClient = cfg.Kube.AuthenticationV1()
	}
	authn, _, err := ac.New()
	if err != nil {
		return nil, fmt.Errorf("read side authentication: %w", err)
	}
	g.authn = authn
	if cfg.Kube != nil {
		authz, err := authorizerfactory.DelegatingAuthorizerConfig{
			SubjectAccessReviewClient: cfg.Kube.AuthorizationV1(),
			AllowCacheTTL:             AllowCacheTTL,
			DenyCacheTTL:              DenyCacheTTL,
			WebhookRetryBackoff:       backoff,
		}.New()
		if err != nil {
			return nil, fmt.Errorf("read side authorization: %w", err)
		}
		g.authz = authz
	}
	return g, nil
}

// Handler lets a request through to next once it is known who sends it and that they
// may: 401 for no or a bad credential, 403 for a reader RBAC does not allow.
func (g *Guard) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.open[r.URL.Path] || g.authn == nil {
			next.ServeHTTP(w, r)
			return
		}
		res, ok, err := g.authn.AuthenticateRequest(r)
		if err != nil || !ok {
			// Never the credential itself: only that it did not do.
			g.log.WithField("path", r.URL.Path).WithField("remote", r.RemoteAddr).Debug("read side: unauthenticated request refused")
			w.Header().Set("WWW-Authenticate", `Bearer realm="imagepin-aggregator"`)
			http.Error(w, "Unauthorized: send a bearer token (a service account's, or kubectl's) or a client certificate of the read side's CA", http.StatusUnauthorized)
			return
		}
		if g.authz != nil {
			attrs := authorizer.AttributesRecord{User: res.User, Verb: verb(r.Method), Path: r.URL.Path, ResourceRequest: false}
			decision, reason, err := g.authz.Authorize(r.Context(), attrs)
			if decision != authorizer.DecisionAllow {
				msg := fmt.Sprintf("Forbidden: user %q may not %s %s (grant it with an RBAC rule: nonResourceURLs: [%q], verbs: [get])",
					res.User.GetName(), attrs.Verb, r.URL.Path, r.URL.Path)
				if reason != "" {
					msg += ": " + reason
				}
				if err != nil {
					g.log.WithError(err).WithField("user", res.User.GetName()).Warn("read side: authorization check failed")
				}
				http.Error(w, msg, http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func verb(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead:
		return "get"
	}
	return strings.ToLower(method)
}
