package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://api.example:6443
    insecure-skip-tls-verify: true
users:
- name: node
  user:
    client-certificate: PEM
    client-key: PEM
contexts:
- name: c
  context: {cluster: c, user: node}
current-context: c
`

func TestConfigFromAKubeconfig(t *testing.T) {
	dir := t.TempDir()
	pem := filepath.Join(dir, "kubelet-client-current.pem")
	if err := os.WriteFile(pem, []byte("read by client-go when it dials"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(kubeconfig, "PEM", pem)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(path, "imagepind/test", 5, 10)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://api.example:6443" || cfg.UserAgent != "imagepind/test" || cfg.QPS != 5 || cfg.Burst != 10 {
		t.Fatalf("config: host %q agent %q qps %v burst %d", cfg.Host, cfg.UserAgent, cfg.QPS, cfg.Burst)
	}
	// The certificate is named by file, so client-go re-reads it when the kubelet rotates it.
	if cfg.CertFile != pem || len(cfg.CertData) != 0 {
		t.Fatalf("client certificate not by file: %q (%d bytes inline)", cfg.CertFile, len(cfg.CertData))
	}
}

func TestConfigErrorsNameTheirCause(t *testing.T) {
	dir := t.TempDir()
	if _, err := Config(filepath.Join(dir, "missing"), "x", 1, 1); err == nil || !strings.HasPrefix(err.Error(), "kubeconfig: ") {
		t.Fatalf("missing kubeconfig: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("clusters: ["), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Config(bad, "x", 1, 1); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("malformed kubeconfig: %v, want its path named", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := Config("", "x", 1, 1); err == nil || !strings.Contains(err.Error(), "in-cluster") {
		t.Fatalf("in-cluster outside a pod: %v", err)
	}
}
