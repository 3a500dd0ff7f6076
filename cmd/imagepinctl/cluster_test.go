package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/status"
)

func TestClusterStatus(t *testing.T) {
	store := aggregator.NewStore(aggregator.DefaultLimits(), time.Now)
	for node, s := range map[string]status.Set{
		"w1": {Name: "upgrade", Phase: status.Ready, ImagesTotal: 4, ImagesReady: 4, BytesTotal: 400, BytesReady: 400},
		"w2": {Name: "upgrade", Phase: status.Failed, ImagesTotal: 4, ImagesReady: 3, BytesTotal: 400, BytesReady: 300,
			Conditions: []status.Condition{{Type: status.ConditionReady, Status: "False", Reason: status.ReasonImageUnavailable, Message: "1 of 4 images cannot be pulled"}}},
	} {
		r := v1.FromStatus(status.Node{Node: status.NodeInfo{Name: node}, Sets: []status.Set{s}}, "b", 1, time.Minute)
		if _, err := store.Ingest(node, r); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(aggregator.ReadHandler(store, nil))
	defer srv.Close()

	code, out, _ := ctl(t, "status", "--aggregator", srv.URL)
	if code != 1 {
		t.Fatalf("a set not ready: exit %d", code)
	}
	for _, want := range []string{"upgrade  false  1/2", "7/8", "[##################..]  88%", "upgrade on w2: Failed ImageUnavailable: 1 of 4 images cannot be pulled"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}

	// --watch redraws until interrupted.
	ctx, cancel := context.WithTimeout(context.Background(), 350*time.Millisecond)
	defer cancel()
	var buf, errBuf bytes.Buffer
	if code := run(ctx, []string{"status", "--aggregator", srv.URL, "--watch", "--interval", "100ms"}, &buf, &errBuf); code != 0 {
		t.Fatalf("watch exit %d: %s", code, errBuf.String())
	}
	if n := strings.Count(buf.String(), "\033[H\033[2J"); n < 2 {
		t.Fatalf("watch drew %d times", n)
	}
	if code, _, errOut := ctl(t, "status", "--aggregator", "http://127.0.0.1:1"); code != 2 || !strings.Contains(errOut, "aggregator") {
		t.Fatalf("unreachable aggregator: %d %s", code, errOut)
	}
}

// The aggregator's address works without a scheme (HTTPS): the client trusts
// --aggregator-ca and sends the kubeconfig's credentials, which the aggregator checks.
func TestAggregatorAddressWithoutScheme(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	store := aggregator.NewStore(aggregator.DefaultLimits(), time.Now)
	r := v1.FromStatus(status.Node{Node: status.NodeInfo{Name: "w1"}, Sets: []status.Set{{Name: "s", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1}}}, "b", 1, time.Minute)
	if _, err := store.Ingest("w1", r); err != nil {
		t.Fatal(err)
	}
	read := aggregator.ReadHandler(store, nil)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer reader-token":
			read.ServeHTTP(w, r)
		case "Bearer other-token":
			http.Error(w, `Forbidden: user "other" may not get /v1/sets`, http.StatusForbidden)
		default:
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeconfig := func(token string) string {
		p := filepath.Join(dir, token+".kubeconfig")
		os.WriteFile(p, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://api.example:6443", certificate-authority-data: "bm90IHRoZSBhZ2dyZWdhdG9yJ3MgQ0E="}}]
users: [{name: u, user: {token: `+token+`}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600)
		return p
	}
	addr := strings.TrimPrefix(srv.URL, "https://")
	code, out, errOut := ctl(t, "status", "--aggregator", addr, "--aggregator-ca", ca, "--kubeconfig", kubeconfig("reader-token"), "-o", "wide")
	if code != 0 || !strings.Contains(out, "s on w1: Ready 1/1 images") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	// KUBECONFIG is found as kubectl finds it.
	t.Setenv("KUBECONFIG", kubeconfig("reader-token"))
	if code, _, errOut := ctl(t, "status", "--aggregator", addr, "--aggregator-ca", ca); code != 0 {
		t.Fatalf("with $KUBECONFIG: exit %d: %s", code, errOut)
	}
	code, _, errOut = ctl(t, "status", "--aggregator", addr, "--aggregator-ca", ca, "--kubeconfig", kubeconfig("other-token"))
	if code != 2 || !strings.Contains(errOut, "403") || !strings.Contains(errOut, "imagepin-aggregator-reader") {
		t.Fatalf("a reader RBAC refuses: exit %d: %s", code, errOut)
	}
	t.Setenv("KUBECONFIG", filepath.Join(dir, "none"))
	code, _, errOut = ctl(t, "status", "--aggregator", addr, "--aggregator-ca", ca)
	if code != 2 || !strings.Contains(errOut, "401") {
		t.Fatalf("no credentials: exit %d: %s", code, errOut)
	}
	// Without the CA the certificate is not trusted.
	if code, _, errOut := ctl(t, "status", "--aggregator", addr, "--kubeconfig", kubeconfig("reader-token")); code != 2 || !strings.Contains(errOut, "certificate") {
		t.Fatalf("an untrusted certificate: exit %d: %s", code, errOut)
	}
}

// Nodes whose only news is broken files or faults: the view says so and needs attention.
func TestClusterStatusShowsNodeProblems(t *testing.T) {
	store := aggregator.NewStore(aggregator.DefaultLimits(), time.Now)
	r := v1.FromStatus(status.Node{Node: status.NodeInfo{Name: "w1"}, Sets: []status.Set{},
		FileErrors: []status.FileError{{File: "s.yaml", Error: "s.yaml: document 1: kind: missing"}},
		Faults:     []string{"sets directory /etc/imagepin/sets.d: no such file or directory"}}, "b", 1, time.Minute)
	if _, err := store.Ingest("w1", r); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(aggregator.ReadHandler(store, nil))
	defer srv.Close()
	code, out, _ := ctl(t, "status", "--aggregator", srv.URL)
	if code != 1 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"no node reports any set (1 nodes known)", "node w1: file error: s.yaml: document 1: kind: missing", "node w1: fault: sets directory"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// Per set: whether its pods start with the registry gone on every node and every blob of
// its images has two holders, and apart: on how many nodes pods start, the Ready nodes
// where they would need the registry and why (never a node whose own pods start), the
// blobs held by too few nodes, and the bytes fetched from registries.
func TestClusterStatusShowsRegistryGone(t *testing.T) {
	t0 := time.Now()
	now := t0
	store := aggregator.NewStore(aggregator.DefaultLimits(), func() time.Time { return now })
	own := func(st, reason string) status.Condition {
		return status.Condition{Type: status.ConditionPodsStartWithoutRegistry, Status: st, Reason: reason, Message: "the kubelet asks the registry"}
	}
	independent := []status.Condition{{Type: status.ConditionRegistryIndependent, Status: status.True, Reason: status.ReasonPodsStartWithoutRegistry}, own(status.True, status.ReasonImagesHeld)}
	dependent := []status.Condition{{Type: status.ConditionRegistryIndependent, Status: status.False, Reason: "CredentialVerification",
		Message: "imagePullCredentialsVerificationPolicy AlwaysVerify: the kubelet asks the registry"}, own(status.False, "CredentialVerification")}
	// The node's own pods start; its blobs too few nodes hold.
	stranded := []status.Condition{{Type: status.ConditionRegistryIndependent, Status: status.False, Reason: status.ReasonBlobsNotHeld, Message: "held by w1 only"},
		own(status.True, status.ReasonImagesHeld)}
	for node, sets := range map[string][]status.Set{
		"w1": {{Name: "apps", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, BytesFromRegistry: 3 << 20, Conditions: independent},
			{Name: "tools", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: independent},
			{Name: "ops", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: stranded},
			{Name: "both", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: stranded}},
		"w2": {{Name: "apps", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: dependent},
			{Name: "tools", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: independent},
			{Name: "ops", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: stranded},
			{Name: "both", Phase: status.Ready, ImagesTotal: 1, ImagesReady: 1, Conditions: dependent}},
	} {
		// Both share the blob of apps' and tools' images; only w1 holds that of ops' and both's.
		n := status.Node{Node: status.NodeInfo{Name: node, Peers: &status.PeerBytes{Address: node + ":7444"}}, Sets: sets, Blobs: []status.ImageBlobs{
			{Image: "reg.example/a@sha256:" + strings.Repeat("a", 64), Sets: []string{"apps", "tools"}, Blobs: []status.Blob{{Digest: "sha256:" + strings.Repeat("1", 64), Size: 1, Held: true}}},
			{Image: "reg.example/o@sha256:" + strings.Repeat("b", 64), Sets: []string{"both", "ops"}, Blobs: []status.Blob{{Digest: "sha256:" + strings.Repeat("2", 64), Size: 1, Held: node == "w1"}}},
		}}
		r := v1.FromStatus(n, "b", 1, time.Minute)
		if _, err := store.Ingest(node, r); err != nil {
			t.Fatal(err)
		}
	}
	now = t0.Add(aggregator.HoldersWarmup) // every node had time to report
	srv := httptest.NewServer(aggregator.ReadHandler(store, nil))
	defer srv.Close()
	_, out, _ := ctl(t, "status", "--aggregator", srv.URL)
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && !strings.HasPrefix(l, " ") { // the table's rows
			lines[f[0]] = l
		}
	}
	for _, c := range []struct{ line, want string }{
		{lines["SET"], "REGISTRY GONE"},
		{lines["apps"], "no: pods start on 1/2 nodes"},
		{lines["tools"], "yes"},
		{lines["ops"], "no: 1 blobs held by < 2 nodes"},
		{lines["both"], "no: pods start on 1/2 nodes, 1 blobs held by < 2 nodes"},
	} {
		if !strings.HasSuffix(strings.TrimSpace(c.line), c.want) {
			t.Errorf("want %q at the end of %q:\n%s", c.want, c.line, out)
		}
	}
	for _, want := range []string{
		"apps on w2: Ready, would need the registry when a pod starts: CredentialVerification: the kubelet asks the registry",
		"both on w2: Ready, would need the registry when a pod starts: CredentialVerification",
		"apps: 3.0 MiB fetched from registries",
		"ops: blobs, for a node joining or replacing one: 1 of the 1 blobs of the images are held by fewer than 2 nodes (with the registry gone, a node joining or replacing one gets every blob from its peers): sha256:" +
			strings.Repeat("2", 64) + " (1 B, of reg.example/o@sha256:" + strings.Repeat("b", 64) + ") is held by w1 only: a node replacing w1 would fail",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	for _, not := range []string{"tools on", "on w1: Ready, would need", "ops on"} {
		if strings.Contains(out, not) {
			t.Errorf("%q in:\n%s", not, out)
		}
	}
}
