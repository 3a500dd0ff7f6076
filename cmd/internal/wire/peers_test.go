package wire

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/conf"
	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/tags/endpoint"
)

// [peers] off: what the mirror left where the config puts it is removed (CRI-O's
// registries drop-in, the mirror's block in containerd's hosts.toml, the tag endpoint's
// CA in certs.d, the store imagepind made), and the administrator's files stay as they
// were. peers.Off's own tests cover a store_dir imagepind never made a store of.
func TestPeersOffRemovesWhatTheConfigNames(t *testing.T) {
	state := t.TempDir()
	cfg := conf.Default()
	cfg.Peers.Enabled = false
	cfg.Peers.TagAddress = "127.0.0.1:7445"
	cfg.Disk.RegistriesConfDir, cfg.Disk.CertsDir, cfg.Containerd.ConfigPath = t.TempDir(), t.TempDir(), t.TempDir()
	cfg.Peers.StoreDir = filepath.Join(t.TempDir(), "data")

	dropIn := filepath.Join(cfg.Disk.RegistriesConfDir, crio.MirrorDropInName)
	admin := filepath.Join(cfg.Disk.RegistriesConfDir, "50-admin.conf")
	os.WriteFile(dropIn, []byte("[[registry]]\n"), 0o644)
	os.WriteFile(admin, []byte("[[registry]]\n"), 0o644)
	hostsToml := filepath.Join(cfg.Containerd.ConfigPath, "quay.io", "hosts.toml")
	os.MkdirAll(filepath.Dir(hostsToml), 0o755)
	adminHosts := "server = \"https://quay.io\"\n"
	os.WriteFile(hostsToml, []byte(adminHosts), 0o644)
	hosts := &containerd.MirrorHosts{Local: "127.0.0.1:7443", ConfigPath: cfg.Containerd.ConfigPath, Record: hostsRecord(state), Path: mirror.PathFor}
	if _, err := hosts.Render([]string{"quay.io/x/a@sha256:" + strings.Repeat("1", 64)}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(hostsToml); string(b) == adminHosts {
		t.Fatal("the mirror's block was not written")
	}
	ca, err := endpoint.LoadCA(state)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := endpoint.Trust(cfg.Disk.CertsDir, cfg.Peers.TagAddress, ca.PEM(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := blobstore.Open(cfg.Peers.StoreDir); err != nil {
		t.Fatal(err)
	}

	if p, err := NewPeers(cfg, state, logrus.New()); err != nil || p != nil {
		t.Fatalf("NewPeers with [peers] off: %v, %v", p, err)
	}
	for _, gone := range []string{dropIn, filepath.Join(cfg.Disk.CertsDir, cfg.Peers.TagAddress, "ca.crt"), hostsRecord(state), cfg.Peers.StoreDir} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s stays with [peers] off: %v", gone, err)
		}
	}
	if _, err := os.Stat(admin); err != nil {
		t.Errorf("the administrator's drop-in: %v", err)
	}
	if b, _ := os.ReadFile(hostsToml); string(b) != adminHosts {
		t.Errorf("hosts.toml with [peers] off:\n%s\nwant the administrator's:\n%s", b, adminHosts)
	}
}

// [peers] as the node takes it: sharing only with an address, the client certificate
// [report]'s unless given, the bandwidth in bytes.
func TestPeersConfig(t *testing.T) {
	cfg := conf.Default()
	cfg.Peers.Enabled = true
	cfg.Peers.MirrorAddress = "127.0.0.1:7443"
	cfg.Peers.Nodes = []string{"10.0.0.2:7444"}
	cfg.Peers.Cert, cfg.Peers.CA, cfg.Peers.ClientCA = "serving.pem", "ca.crt", "client-ca.crt"
	cfg.Report.Cert = "kubelet-client.pem"
	cfg.Peers.MaxServing, cfg.Peers.ServeMiBPerSecond = 8, 50
	if got := PeersConfig(cfg); got.Address != "" || got.MirrorAddress != "127.0.0.1:7443" || got.Nodes != nil || got.ClientCert != "" {
		t.Fatalf("without an address the node shares nothing: %+v", got)
	}
	cfg.Peers.Address = "10.0.0.1:7444"
	got := PeersConfig(cfg)
	if got.Address != "10.0.0.1:7444" || len(got.Nodes) != 1 || got.ClientCert != "kubelet-client.pem" || got.Cert != "serving.pem" ||
		got.CA != "ca.crt" || got.ClientCA != "client-ca.crt" || got.MaxServing != 8 || got.ServeBytesPerSecond != 50<<20 {
		t.Fatalf("sharing: %+v", got)
	}
	cfg.Peers.ClientCert = "own.pem"
	if got := PeersConfig(cfg); got.ClientCert != "own.pem" || got.ClientKey != "" {
		t.Fatalf("client_cert given: %+v", got)
	}
	// k3s and RKE2: each key apart from its certificate; the client's defaults to
	// [report]'s with its certificate.
	cfg.Peers.ClientCert, cfg.Peers.Key = "", "/agent/serving-kubelet.key"
	cfg.Report.Cert, cfg.Report.Key = "/agent/client-kubelet.crt", "/agent/client-kubelet.key"
	if got := PeersConfig(cfg); got.CertKey != "/agent/serving-kubelet.key" ||
		got.ClientCert != "/agent/client-kubelet.crt" || got.ClientKey != "/agent/client-kubelet.key" {
		t.Fatalf("keys apart: %+v", got)
	}
	cfg.Peers.ClientCert, cfg.Peers.ClientKey = "/own.crt", "/own.key"
	if got := PeersConfig(cfg); got.ClientCert != "/own.crt" || got.ClientKey != "/own.key" {
		t.Fatalf("client_cert and client_key given: %+v", got)
	}
}
