//go:build e2e

package e2e

import (
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The aggregator's read side against a real kube-apiserver: anonymous requests and a
// token RBAC does not allow are refused, a token bound to the shipped reader roles gets
// in (checked with TokenReview and SubjectAccessReview, as the aggregator's service
// account may through system:auth-delegator), the probes stay open, and imagepinctl
// status --aggregator works with kubectl's credentials.
func TestReadSideAuthenticatesAndAuthorizes(t *testing.T) {
	c := newCluster(t)
	agg := c.startClusterAggregator("aggregator", "--leader-elect=false")
	token := func(sa string) string {
		t.Helper()
		if _, err := c.cs.CoreV1().ServiceAccounts("imagepin").Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tok, err := c.cs.CoreV1().ServiceAccounts("imagepin").CreateToken(t.Context(), sa,
			&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tok.Status.Token
	}
	nobody, reader, prometheus := token("nobody"), token("reader"), token("prometheus")
	for sa, role := range map[string]string{"reader": "imagepin-aggregator-reader", "prometheus": "imagepin-aggregator-metrics-reader"} {
		c.applyYAML(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ` + sa + `-reads-imagepin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ` + role + `}
subjects: [{kind: ServiceAccount, name: ` + sa + `, namespace: imagepin}]
`)
	}
	for _, r := range []struct {
		path, who, token string
		want             int
	}{
		{"/v1/sets", "anonymous", "", http.StatusUnauthorized},
		{"/", "anonymous", "", http.StatusUnauthorized},
		{"/metrics", "anonymous", "", http.StatusUnauthorized},
		{"/v1/sets", "a made-up token", "not-a-token", http.StatusUnauthorized},
		{"/v1/sets", "a token without RBAC", nobody, http.StatusForbidden},
		{"/metrics", "a token without RBAC", nobody, http.StatusForbidden},
		{"/v1/sets", "the reader", reader, http.StatusOK},
		{"/v1/nodes", "the reader", reader, http.StatusOK},
		{"/", "the reader", reader, http.StatusOK},
		{"/metrics", "prometheus", prometheus, http.StatusOK},
		{"/v1/nodes", "prometheus", prometheus, http.StatusForbidden},
		{"/v1/sets", "the cluster admin", c.kube.AdminToken, http.StatusOK},
		{"/healthz", "anonymous", "", http.StatusOK},
		{"/readyz", "anonymous", "", http.StatusOK},
	} {
		resp, err := agg.getAs(r.path, r.token)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != r.want {
			t.Errorf("GET %s as %s: %d, want %d: %s", r.path, r.who, resp.StatusCode, r.want, body)
		}
		t.Logf("GET %s as %s: %s", r.path, r.who, resp.Status)
	}
	// Plain HTTP is not served.
	if resp, err := http.Get(strings.Replace(agg.httpURL, "https://", "http://", 1) + "/v1/sets"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("the read side answered plain HTTP")
		}
	}
	// The command line with kubectl's credentials (a kubeconfig with the reader's token).
	kc := filepath.Join(c.dir, "reader.kubeconfig")
	if err := c.kube.TokenKubeconfig(kc, reader); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(binDir, "imagepinctl"), "status", "--aggregator", agg.httpURL,
		"--aggregator-ca", c.serverCA.File, "--kubeconfig", kc).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) || !strings.Contains(string(out), "cluster view from") {
		t.Fatalf("imagepinctl status as the reader: %v\n%s", err, out)
	}
	nk := filepath.Join(c.dir, "nobody.kubeconfig")
	if err := c.kube.TokenKubeconfig(nk, nobody); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(filepath.Join(binDir, "imagepinctl"), "status", "--aggregator", agg.httpURL,
		"--aggregator-ca", c.serverCA.File, "--kubeconfig", nk).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "403") {
		t.Fatalf("imagepinctl status without RBAC: %v\n%s", err, out)
	}
}
