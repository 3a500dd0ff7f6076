package env

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/imagepin/imagepin/test/testcerts"
)

// Kube is a real etcd and kube-apiserver (hack/kube-deps.sh builds them) on loopback,
// authorizing as a real cluster does: Node,RBAC, the NodeRestriction admission plugin,
// client certificates from ClientCA (which also signs kubelet-style node certificates),
// and an admin token in group system:masters.
type Kube struct {
	Dir        string
	URL        string
	ServerCA   *testcerts.CA // signs the API server's serving certificate
	ClientCA   *testcerts.CA // the kubelet client CA: node certificates
	AdminToken string

	etcdPort, apiPort int
	etcd, api         *exec.Cmd
	etcdExit, apiExit chan struct{}
}

// StartKube starts etcd and kube-apiserver under dir and waits until the API answers.
func StartKube(dir string) (*Kube, error) {
	bin := CacheDir()
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("%s/%s missing: run hack/kube-deps.sh", bin, b)
		}
	}
	k := &Kube{Dir: dir, AdminToken: "imagepin-e2e-admin-token"}
	var err error
	if k.ServerCA, err = testcerts.NewCA(dir, "apiserver-ca"); err != nil {
		return nil, err
	}
	if k.ClientCA, err = testcerts.NewCA(dir, "kubelet-client-ca"); err != nil {
		return nil, err
	}
	if _, _, err = k.ServerCA.Server(dir, "apiserver"); err != nil {
		return nil, err
	}
	if err := writeRSAKeyPair(filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(k.AdminToken+",admin,1,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	if k.etcdPort, err = FreePort(); err != nil {
		return nil, err
	}
	if k.apiPort, err = FreePort(); err != nil {
		return nil, err
	}
	k.URL = "https://127.0.0.1:" + strconv.Itoa(k.apiPort)
	if err := k.startEtcd(); err != nil {
		return nil, err
	}
	if err := k.StartAPIServer(); err != nil {
		k.Stop()
		return nil, err
	}
	return k, nil
}

func writeRSAKeyPair(keyFile, pubFile string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

func (k *Kube) startEtcd() error {
	peer, err := FreePort()
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(k.etcdPort)
	cmd, exit, err := k.run("etcd", filepath.Join(CacheDir(), "etcd"),
		"--data-dir", filepath.Join(k.Dir, "etcd"), "--name", "e2e",
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peer),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peer),
		"--initial-cluster", "e2e=http://127.0.0.1:"+strconv.Itoa(peer),
		"--quota-backend-bytes", strconv.Itoa(1<<30), "--log-level", "warn")
	if err != nil {
		return err
	}
	k.etcd, k.etcdExit = cmd, exit
	return waitHTTP(client+"/health", nil, exit, 30*time.Second)
}

// StartAPIServer (re)starts kube-apiserver on the same port, against the same etcd.
func (k *Kube) StartAPIServer() error {
	cmd, exit, err := k.run("kube-apiserver", filepath.Join(CacheDir(), "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:"+strconv.Itoa(k.etcdPort),
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", strconv.Itoa(k.apiPort),
		"--tls-cert-file", filepath.Join(k.Dir, "apiserver.crt"), "--tls-private-key-file", filepath.Join(k.Dir, "apiserver.key"),
		"--client-ca-file", k.ClientCA.File,
		"--token-auth-file", filepath.Join(k.Dir, "tokens.csv"),
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--service-account-key-file", filepath.Join(k.Dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(k.Dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--cert-dir", filepath.Join(k.Dir, "apiserver-certs"))
	if err != nil {
		return err
	}
	k.api, k.apiExit = cmd, exit
	return waitHTTP(k.URL+"/readyz", k, exit, 90*time.Second)
}

// StopAPIServer stops kube-apiserver (etcd keeps the data): the API is unreachable.
func (k *Kube) StopAPIServer() {
	stopProc(k.api, k.apiExit)
	k.api = nil
}

// Stop stops both.
func (k *Kube) Stop() {
	stopProc(k.api, k.apiExit)
	stopProc(k.etcd, k.etcdExit)
	k.api, k.etcd = nil, nil
}

func (k *Kube) run(name, bin string, args ...string) (*exec.Cmd, chan struct{}, error) {
	logf, err := os.OpenFile(filepath.Join(k.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, err
	}
	exit := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exit) }()
	return cmd, exit, nil
}

func waitHTTP(url string, k *Kube, exit <-chan struct{}, timeout time.Duration) error {
	client := http.DefaultClient
	if k != nil {
		rc := k.AdminConfig()
		tr, err := rest.TransportFor(rc)
		if err != nil {
			return err
		}
		client = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-exit:
			return fmt.Errorf("%s: the process exited", url)
		default:
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s: not ready after %s", url, timeout)
}

// AdminConfig is a client config in group system:masters.
func (k *Kube) AdminConfig() *rest.Config {
	return &rest.Config{Host: k.URL, BearerToken: k.AdminToken, TLSClientConfig: rest.TLSClientConfig{CAFile: k.ServerCA.File},
		QPS: 100, Burst: 200}
}

// NodeKubeconfig writes a kubelet-style kubeconfig for node: a client certificate
// (CN system:node:<node>, O system:nodes) named by file, as the kubelet's
// kubelet-client-current.pem is. It returns the kubeconfig's and the certificate's paths.
// server "" is the API server itself; a proxy's address reaches it through the proxy.
func (k *Kube) NodeKubeconfig(dir, node, server string) (kubeconfig, cert string, err error) {
	cert, err = k.ClientCA.Node(dir, node)
	if err != nil {
		return "", "", err
	}
	kubeconfig = filepath.Join(dir, node+".kubeconfig")
	return kubeconfig, cert, k.writeKubeconfig(kubeconfig, server, fmt.Sprintf("client-certificate: %s\n    client-key: %s", cert, cert))
}

// TokenKubeconfig writes a kubeconfig that authenticates with a bearer token.
func (k *Kube) TokenKubeconfig(path, token string) error {
	return k.writeKubeconfig(path, "", "token: "+token)
}

func (k *Kube) writeKubeconfig(path, server, user string) error {
	if server == "" {
		server = k.URL
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: e2e
  user:
    %s
contexts:
- name: e2e
  context: {cluster: e2e, user: e2e}
current-context: e2e
`, server, k.ServerCA.File, user)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// LogTail is the end of a component's log ("etcd" or "kube-apiserver").
func (k *Kube) LogTail(name string, n int) string {
	return logTail(filepath.Join(k.Dir, name+".log"), n)
}
