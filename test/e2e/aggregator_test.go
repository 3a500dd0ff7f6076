//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
	"github.com/imagepin/imagepin/test/testcerts"
)

type aggregatorProc struct {
	t                 *testing.T
	args              []string
	cmd               *exec.Cmd
	httpURL, grpcAddr string
	log               string
	// client trusts the aggregator's serving certificate; token, when set, is sent as a
	// bearer token (the read side checks it with the API server).
	client *http.Client
	token  string
}

// get asks the read side for path with the test's credentials.
func (a *aggregatorProc) get(path string) (*http.Response, error) {
	return a.getAs(path, a.token)
}

// getAs asks the read side for path with a bearer token ("" for none).
func (a *aggregatorProc) getAs(path, token string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, a.httpURL+path, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return a.client.Do(req)
}

func startAggregator(t *testing.T, dir string) (*aggregatorProc, *testcerts.CA, *testcerts.CA) {
	t.Helper()
	kubeletCA, err := testcerts.NewCA(dir, "kubelet-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	serverCA, err := testcerts.NewCA(dir, "aggregator-ca")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := serverCA.Server(dir, "aggregator")
	if err != nil {
		t.Fatal(err)
	}
	gp, _ := env.FreePort()
	hp, _ := env.FreePort()
	client, err := serverCA.HTTPClient("")
	if err != nil {
		t.Fatal(err)
	}
	a := &aggregatorProc{t: t, grpcAddr: "127.0.0.1:" + strconv.Itoa(gp), httpURL: "https://127.0.0.1:" + strconv.Itoa(hp), log: filepath.Join(dir, "aggregator.log"), client: client}
	a.args = []string{"--grpc-address", a.grpcAddr, "--http-address", "127.0.0.1:" + strconv.Itoa(hp),
		"--tls-cert", cert, "--tls-key", key, "--client-ca", kubeletCA.File}
	a.start()
	t.Cleanup(a.stop)
	return a, kubeletCA, serverCA
}

func (a *aggregatorProc) start() {
	a.t.Helper()
	logf, _ := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	a.cmd = exec.Command(filepath.Join(binDir, "imagepin-aggregator"), a.args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	waitUntil(a.t, "the aggregator", 10*time.Second, func() bool {
		resp, err := a.get("/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
}

func (a *aggregatorProc) stop() {
	if a.cmd != nil {
		a.cmd.Process.Signal(os.Interrupt)
		a.cmd.Wait()
		a.cmd = nil
	}
}

func (a *aggregatorProc) set(name string) (aggregator.SetView, bool) {
	resp, err := a.get("/v1/sets/" + name + "?nodes=all")
	if err != nil {
		return aggregator.SetView{}, false
	}
	defer resp.Body.Close()
	var v aggregator.SetView
	return v, resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&v) == nil
}

// imagepind reports to a real aggregator over mTLS with a kubelet-style certificate;
// the aggregator going away does not stop imagepind, and the latest state arrives when
// it is back.
func TestImagepindReportsToAggregator(t *testing.T) {
	w := baseWorld(t)
	if err := w.crio.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.crio.Cleanup)
	w.dialCRI()
	agg, kubeletCA, serverCA := startAggregator(t, w.dir)
	nodeCert, err := kubeletCA.Node(w.dir, "e2e-node")
	if err != nil {
		t.Fatal(err)
	}
	w.writeConfig(worldOptions{extra: fmt.Sprintf("[report]\naggregator = %q\nheartbeat = \"1s\"\ncert = %q\nca = %q\n", agg.grpcAddr, nodeCert, serverCA.File)})
	a := w.push("agg-a", 2)
	w.startDaemon()
	w.writeSet("a.yaml", alphaSet("a", a...))
	w.waitFor("a Ready", 60*time.Second, phaseIs("a", status.Ready))
	waitUntil(t, "the aggregator sees a Ready on e2e-node", 20*time.Second, func() bool {
		v, ok := agg.set("a")
		return ok && v.Ready && v.Targeted == 1 && len(v.Nodes) == 1 && v.Nodes[0].Node == "e2e-node"
	})

	// The aggregator goes away: imagepind carries on.
	agg.stop()
	b := w.push("agg-b", 1)
	w.writeSet("b.yaml", alphaSet("b", b...))
	w.waitFor("b Ready while the aggregator is down", 60*time.Second, phaseIs("b", status.Ready))
	// Back (empty: a restart loses nothing the next heartbeat does not restore).
	agg.start()
	waitUntil(t, "the latest state after the aggregator is back", 20*time.Second, func() bool {
		va, oka := agg.set("a")
		vb, okb := agg.set("b")
		return oka && okb && va.Ready && vb.Ready
	})
	// And the cluster view on the command line.
	// Without --cluster the read side is on loopback, over HTTPS, with no credentials.
	cmd := exec.Command(filepath.Join(binDir, "imagepinctl"), "status", "--aggregator", agg.httpURL, "--aggregator-ca", serverCA.File)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(w.dir, "no-kubeconfig"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("imagepinctl status --aggregator: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
