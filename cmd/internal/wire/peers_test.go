package wire

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/conf"
)

// [peers] off with store_dir naming a directory imagepind never made a store of (the
// state directory, a data mount): every file in it stays. Before, imagepind ran
// os.RemoveAll(store_dir) at every start with [peers] off.
func TestPeersOffLeavesAStoreDirItDidNotMake(t *testing.T) {
	state := t.TempDir()
	data := filepath.Join(t.TempDir(), "data")
	os.MkdirAll(filepath.Join(data, "blobs"), 0o755)
	os.WriteFile(filepath.Join(data, "blobs", "mine"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(data, "db"), []byte("y"), 0o600)
	cfg := conf.Default()
	cfg.Disk.RegistriesConfDir = t.TempDir()
	cfg.Peers.Enabled = false
	cfg.Peers.StoreDir = data
	if p, err := NewPeers(cfg, state, logrus.New()); err != nil || p != nil {
		t.Fatalf("NewPeers with [peers] off: %v, %v", p, err)
	}
	for _, f := range []string{"blobs/mine", "db"} {
		if _, err := os.Stat(filepath.Join(data, f)); err != nil {
			t.Errorf("%s deleted with [peers] off: %v", f, err)
		}
	}

	// A store it made is removed, and only what the store holds.
	if _, err := blobstore.Open(data); err != nil {
		t.Fatal(err)
	}
	if _, err := NewPeers(cfg, state, logrus.New()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(data, ".imagepin-blobstore")); !os.IsNotExist(err) {
		t.Errorf("the store's marker stays with [peers] off: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, "db")); err != nil {
		t.Errorf("db deleted with the store: %v", err)
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
	if got := PeersConfig(cfg); got.ClientCert != "own.pem" {
		t.Fatalf("client_cert given: %+v", got)
	}
}
