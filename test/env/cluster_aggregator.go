package env

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/imagepin/imagepin/test/testcerts"
)

// tokenSeconds is how long the aggregator's token lasts: longer than any test.
var tokenSeconds int64 = 3 * 3600

// Aggregator is one imagepin-aggregator replica in --cluster mode, with the shipped
// RBAC's identity (its service account's token).
type Aggregator struct {
	Name     string
	GRPCAddr string
	HTTPURL  string
	Log      string
	client   *http.Client
	cmd      *exec.Cmd
	exit     chan struct{}
}

// startAggregators starts the replicas on one Lease and the Service-like proxy in front
// of their report listeners, and waits until one leads.
func (c *Cluster) startAggregators(ctx context.Context) error {
	tok, err := c.CS.CoreV1().ServiceAccounts("imagepin").CreateToken(ctx, "imagepin-aggregator",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &tokenSeconds}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for the aggregator's service account: %w", err)
	}
	c.aggKubeconfig = filepath.Join(c.Kube.Dir, "aggregator.kubeconfig")
	if err := c.Kube.TokenKubeconfig(c.aggKubeconfig, tok.Status.Token); err != nil {
		return err
	}
	if c.aggCA, err = testcerts.NewCA(c.Dir, "aggregator-ca"); err != nil {
		return err
	}
	if c.aggCert, c.aggKey, err = c.aggCA.Server(c.Dir, "aggregator"); err != nil {
		return err
	}
	var grpc []string
	for i := range c.opts.AggregatorReplicas {
		a, err := c.startAggregator(fmt.Sprintf("aggregator-%d", i+1))
		if err != nil {
			return err
		}
		c.Aggregators = append(c.Aggregators, a)
		grpc = append(grpc, a.GRPCAddr)
	}
	if c.AggregatorService, err = StartProxy(grpc...); err != nil {
		return err
	}
	return c.waitFor("an aggregator leading", 60*time.Second, func() (bool, error) { return c.Leader() != nil, nil })
}

func (c *Cluster) startAggregator(name string) (*Aggregator, error) {
	gp, err := FreePort()
	if err != nil {
		return nil, err
	}
	hp, err := FreePort()
	if err != nil {
		return nil, err
	}
	client, err := c.aggCA.HTTPClient("")
	if err != nil {
		return nil, err
	}
	a := &Aggregator{Name: name, GRPCAddr: "127.0.0.1:" + strconv.Itoa(gp), HTTPURL: "https://127.0.0.1:" + strconv.Itoa(hp),
		Log: filepath.Join(c.Dir, name+".log"), client: client}
	logf, err := os.OpenFile(a.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// A short lease, so that a takeover fits in a test; status written at most every second.
	a.cmd = exec.Command(filepath.Join(c.opts.Bin, "imagepin-aggregator"),
		"--grpc-address", a.GRPCAddr, "--http-address", "127.0.0.1:"+strconv.Itoa(hp),
		"--tls-cert", c.aggCert, "--tls-key", c.aggKey, "--client-ca", c.Kube.ClientCA.File,
		"--cluster", "--kubeconfig", c.aggKubeconfig, "--leader-elect-namespace", "imagepin", "--leader-elect-identity", name,
		"--leader-elect-lease-duration", "4s", "--leader-elect-renew-deadline", "3s", "--leader-elect-retry-period", "500ms",
		"--status-min-interval", "1s", "--status-warmup", "3s", "--log-level", "debug")
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	a.exit = make(chan struct{})
	go func() { a.cmd.Wait(); logf.Close(); close(a.exit) }()
	return a, c.waitFor(name+" /healthz", 30*time.Second, func() (bool, error) {
		select {
		case <-a.exit:
			return false, fmt.Errorf("%s exited:\n%s", name, logTail(a.Log, 20))
		default:
		}
		return a.get("/healthz") == http.StatusOK, nil
	})
}

func (a *Aggregator) get(path string) int {
	resp, err := a.client.Get(a.HTTPURL + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Leading says whether this replica holds the Lease (only the leader is ready).
func (a *Aggregator) Leading() bool { return a.cmd != nil && a.get("/readyz") == http.StatusOK }

// Leader is the replica that leads now (nil: none).
func (c *Cluster) Leader() *Aggregator {
	for _, a := range c.Aggregators {
		if a.Leading() {
			return a
		}
	}
	return nil
}

// Stop stops the replica (SIGTERM, then SIGKILL).
func (a *Aggregator) Stop() {
	stopProc(a.cmd, a.exit)
	a.cmd = nil
}
