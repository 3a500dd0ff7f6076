package peers

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/mirror/sourcetest"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
	"github.com/imagepin/imagepin/test/testcerts"
)

// The peers as a Source keep the contract: three in-process nodes over HTTPS with node
// certificates, each pinning the origin's index and reaching the origin's registry
// through its own access (mirror.FromRegistry), as imagepind wires them. Asked from a
// node among them (its turn in each digest's order is the registry), and from a node
// that serves no peers (every peer first, the registry last).
func TestSourceConforms(t *testing.T) {
	for _, c := range []struct {
		name  string
		among bool
	}{{"ANodeAmongItsPeers", true}, {"ANodeServingNoPeers", false}} {
		t.Run(c.name, func(t *testing.T) {
			sourcetest.Run(t, sourcetest.Subject{New: func(t *testing.T, o *sourcetest.Origin) mirror.Source {
				return conformanceCluster(t, o, 3, c.among)
			}})
		})
	}
}

// conformanceCluster starts n nodes over o and returns a node's Source: the first
// node's (among), or one of a node outside them that serves no peers.
func conformanceCluster(t *testing.T, o *sourcetest.Origin, n int, among bool) *Source {
	t.Helper()
	dir := o.TempDir(t)
	ca, err := testcerts.NewCA(dir, "nodes-ca")
	if err != nil {
		t.Fatal(err)
	}
	files := registrytest.NewFiles(t, "")
	certs := o.CertsDir(t)
	log := logrus.New()
	log.Out = io.Discard
	// each is one node's way to the registry, its client to its peers, its stats.
	each := func(name string) (mirror.Source, *http.Client, *Stats) {
		cert, err := ca.Node(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		client, err := Client(cert, "", ca.File)
		if err != nil {
			t.Fatal(err)
		}
		stats := &Stats{}
		access := registry.New(registry.Config{RegistriesConf: files.Conf, RegistriesConfDir: files.ConfDir, CertsDir: certs}, nil)
		return CountRegistry(mirror.FromRegistry(access), stats), client, stats
	}
	var addrs []string
	listeners := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[i] = l
		addrs = append(addrs, l.Addr().String())
	}
	nodes := func() []string { return addrs }
	var first *Source
	for i := range n {
		name := fmt.Sprintf("node-%d", i)
		serving, err := ca.NodeServing(dir, name, net.ParseIP("127.0.0.1"))
		if err != nil {
			t.Fatal(err)
		}
		srvTLS, err := ServerTLS(serving, "", ca.File)
		if err != nil {
			t.Fatal(err)
		}
		store, err := blobstore.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		reg, client, stats := each(name)
		src := NewSource(addrs[i], nodes, reg, client, stats, log.WithField("node", name))
		m := mirror.New(store, o.Pinned, log.WithField("node", name))
		// Last: the fills under way end before their stores go (a node's fill may read
		// from another node).
		t.Cleanup(m.Close)
		server := &Server{Mirror: m.PeerHandler(reg, src, &mirror.Stats{}), MaxServing: 4, Stats: stats, Log: log}
		server.init()
		peer := &http.Server{Handler: server, TLSConfig: srvTLS}
		go peer.ServeTLS(listeners[i], "", "")
		t.Cleanup(func() { peer.Close() })
		if i == 0 {
			first = src
		}
	}
	if among {
		return first
	}
	reg, client, stats := each("node-asking")
	return NewSource("", nodes, reg, client, stats, log.WithField("node", "node-asking"))
}
