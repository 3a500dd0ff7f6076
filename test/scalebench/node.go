package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/mirror"
	"github.com/imagepin/imagepin/peers"
	imgregistry "github.com/imagepin/imagepin/registry"
)

// setFanout gives a node's peers.Source the fanout of the k-ary tree a blob spreads
// along over the rendezvous order (k ≥ N: every node reads from the first, a star). It
// says whether the Source has the knob (it does; the "star" mode is the baseline).
func setFanout(s *peers.Source, k int) bool {
	s.Fanout = k
	return true
}

// creds are one node's certificates (node name, serving and client PEM files).
type creds struct {
	IP              string
	Serving, Client string
}

// node is one simulated node: the daemon's node-local mirror (mirror.Mirror with a
// peers.Source over its blob store, and the peers' HTTPS server), built as
// peers.Node.share builds them, with this node's links: an upload bound on what its
// peer server sends, a download bound on what it reads from peers and the registry.
type node struct {
	name  string
	addr  string // peer address (host:port)
	stats *peers.Stats
	src   *peers.Source

	local     *http.Server
	localAddr string
	server    *peers.Server
	serverTLS *tls.Config
	client    *http.Client
	peerHTTP  *http.Client

	serveDone chan struct{}
	warnings  *warnCounter
	served    served // what its peer server sent, by blob and asker
}

// nodeOptions are what every node of a run shares.
type nodeOptions struct {
	addrs        []string
	ca           string
	registryConf string // registries.conf naming the link as an insecure registry
	emptyDir     string
	pinned       map[string]bool // repo@digest
	maxServing   int
	serveBPS     int64 // the daemon's serve_mib_per_second (0: none)
	upBPS        int64 // the node's upload (0: none)
	downBPS      int64 // the node's download (0: none)
	fanout       int
	warnings     *warnCounter
}

func newNode(dir string, i int, c creds, o nodeOptions) (*node, error) {
	name := fmt.Sprintf("node-%d", i)
	store, err := blobstore.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	log.SetLevel(logrus.WarnLevel)
	log.AddHook(o.warnings)
	entry := log.WithField("node", name)

	n := &node{name: name, addr: o.addrs[i], stats: &peers.Stats{}, warnings: o.warnings, serveDone: make(chan struct{})}
	down := newPace(o.downBPS)
	pinned := o.pinned
	m := mirror.New(store, func(repo string, d digest.Digest) bool { return pinned[repo+"@"+d.String()] }, entry.WithField("part", "mirror"))

	// The node's own way to the registry, as wire.BindPeers builds it (registries.conf
	// naming the link as an insecure registry), read through the node's download.
	rc := imgregistry.New(imgregistry.Config{RegistriesConf: o.registryConf, RegistriesConfDir: o.emptyDir, CertsDir: o.emptyDir,
		NoUncompressedSizes: true, Platform: imgregistry.Platform{OS: "linux", Architecture: "amd64"}}, nil)
	reg := peers.CountRegistry(pacedSource{mirror.FromRegistry(rc), down}, n.stats)

	// As peers.Node.share.
	client, err := peers.Client(c.Client, "", o.ca)
	if err != nil {
		return nil, err
	}
	paceClient(client, down, &o.warnings.dials)
	countPurposes(client, &o.warnings.purposes)
	serverTLS, err := peers.ServerTLS(c.Serving, "", o.ca)
	if err != nil {
		return nil, err
	}
	addrs := o.addrs
	n.src = peers.NewSource(n.addr, func() []string { return addrs }, reg, client, n.stats, entry.WithField("part", "peers"))
	setFanout(n.src, o.fanout)
	bps := o.serveBPS
	if o.upBPS > 0 && (bps == 0 || o.upBPS < bps) {
		bps = o.upBPS
	}
	n.server = &peers.Server{Mirror: n.served.wrap(m.PeerHandler(reg, n.src, &mirror.Stats{})), MaxServing: o.maxServing,
		BytesPerSecond: bps, Stats: n.stats, Log: entry.WithField("part", "peers")}
	n.serverTLS = serverTLS
	n.peerHTTP = client

	// The node-local mirror the runtime pulls through (plain HTTP, in memory: pipe.go).
	l := newPipeListener()
	n.localAddr = "mirror.local"
	n.local = &http.Server{Handler: m.Handler(n.src, &mirror.Stats{}), ReadHeaderTimeout: 10 * time.Second}
	go n.local.Serve(l)
	n.client = &http.Client{Transport: &http.Transport{DialContext: l.dial, MaxIdleConnsPerHost: 64, DisableCompression: true}}
	return n, nil
}

// join starts serving the peers (a node that has not joined refuses connections) and
// returns once its listener accepts.
func (n *node) join(ctx context.Context) error {
	go func() {
		defer close(n.serveDone)
		if err := n.server.Serve(ctx, n.addr, n.serverTLS); err != nil {
			fmt.Fprintf(os.Stderr, "%s: serving peers: %v\n", n.name, err)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", n.addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: its peer server does not listen: %w", n.name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop ends the node (ctx of join already cancelled).
func (n *node) stop(joined bool) {
	n.local.Close()
	if joined {
		<-n.serveDone
	}
	n.client.CloseIdleConnections()
	n.peerHTTP.CloseIdleConnections()
}

// pull reads every image of the set through the node's local mirror as a runtime
// does: each image's manifest, then its config and layers at once, each checked
// against its digest; width images at a time. A blob whose copy is cut is asked
// again a second later (the pull's retry). It returns how many retries it took.
func (n *node) pull(ctx context.Context, images []imageRef, width int) (int, error) {
	var retries atomic.Int64
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	errs := make(chan error, len(images))
	for _, img := range images {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := n.pullImage(ctx, img, &retries); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return int(retries.Load()), <-errs
}

func (n *node) pullImage(ctx context.Context, img imageRef, retries *atomic.Int64) error {
	repo := mirror.PathFor(img.Repo)
	data, err := n.get(ctx, repo, "manifests", img.Manifest, retries)
	if err != nil {
		return err
	}
	var man struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(data, &man); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(man.Layers)+1)
	for i, d := range append([]descriptor{man.Config}, man.Layers...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.get(ctx, repo, "blobs", d.Digest, retries)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// get reads repo's manifest or blob d whole from the local mirror and checks it,
// asking again while it fails (until ctx ends); a manifest's bytes are returned.
func (n *node) get(ctx context.Context, repo, kind string, d digest.Digest, retries *atomic.Int64) ([]byte, error) {
	for {
		data, err := n.getOnce(ctx, repo, kind, d)
		if err == nil {
			return data, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %s %s: %w (last: %v)", n.name, kind, d, ctx.Err(), err)
		}
		retries.Add(1)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (n *node) getOnce(ctx context.Context, repo, kind string, d digest.Digest) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.localAddr+"/v2/"+repo+"/"+kind+"/"+d.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := n.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	h := sha256.New()
	var keep strings.Builder
	w := io.Writer(h)
	if kind == "manifests" {
		w = io.MultiWriter(h, &keep)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return nil, err
	}
	if got := digest.NewDigest(digest.SHA256, h); got != d {
		return nil, fmt.Errorf("got %s", got)
	}
	return []byte(keep.String()), nil
}

// paceBurst is the most bytes a paced read waits for at once.
const paceBurst = 64 << 10

// pace is a node's download: its limiter (nil: unbounded) and the bytes one read waits
// for at once, peers.PaceChunk of its rate (a twentieth of a second's worth), so that a
// small message (a handshake, a 102 Processing) waits behind a chunk of each transfer
// under way, not 64 KiB of each: at the bench's slowed links that was seconds, and the
// protocol's bounds (3 s to dial, 15 s without a byte) are not slowed with them.
type pace struct {
	lim   *rate.Limiter
	chunk int
}

func newPace(bytesPerSecond int64) pace {
	if bytesPerSecond <= 0 {
		return pace{}
	}
	return pace{rate.NewLimiter(rate.Limit(bytesPerSecond), paceBurst), peers.PaceChunk(bytesPerSecond)}
}

// read reads r within the chunk and waits for what it read.
func (p pace) read(r io.Reader, b []byte) (int, error) {
	n, err := r.Read(b[:min(len(b), p.chunk)])
	if n > 0 {
		p.lim.WaitN(context.Background(), n)
	}
	return n, err
}

// pacedSource is the registry read through the node's download.
type pacedSource struct {
	mirror.Source
	down pace
}

func (p pacedSource) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	rc, announced, err := p.Source.Blob(ctx, repo, chain, d, size)
	if err != nil || p.down.lim == nil {
		return rc, announced, err
	}
	return pacedReader{rc, p.down}, announced, nil
}

type pacedReader struct {
	io.ReadCloser
	down pace
}

func (p pacedReader) Read(b []byte) (int, error) { return p.down.read(p.ReadCloser, b) }

// paceClient makes every connection the peers' client opens read through down: the
// TCP connections under the TLS peers.Client dials (HTTP/2, one a peer).
// Each connection dialled is counted in dials.
func paceClient(c *http.Client, down pace, dials *atomic.Int64) {
	tr := c.Transport.(*http.Transport)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		conn, err := dial(ctx, network, addr)
		if err != nil || down.lim == nil {
			return conn, err
		}
		return &pacedConn{Conn: conn, down: down}, nil
	}
}

type pacedConn struct {
	net.Conn
	down pace
}

func (p *pacedConn) Read(b []byte) (int, error) {
	return p.down.read(p.Conn, b)
}

// warnCounter counts what the nodes log at warning level and above, by kind.
type warnCounter struct {
	setAside, cut, other atomic.Int64
	dials                atomic.Int64 // connections the nodes' peer clients dialled
	purposes             purposes     // their requests, dials and handshakes by purpose
	mu                   sync.Mutex
	samples              []string
	asideWhy             map[string]int64 // the peers set aside by what was asked and why
	// climbed are the nodes that asked the registry for a blob their tree's head
	// sends (peers: its ancestors could not), with why (the first few).
	climbed []string
}

// climbedKept is how many registry turns past the tree a worker keeps to print.
const climbedKept = 8

// urlOrAddrs are the parts of an error naming a request's URL or a connection's
// addresses (Get "https://…": , https://…: , write tcp a->b: ).
var urlOrAddrs = regexp.MustCompile(`(Get "https://[^"]*": |https://\S*: |(read|write|dial) tcp \S*->\S*: |(read|write|dial) tcp \S*: )`)

// asideKind is what a peer set aside was asked (a manifest or a blob) and why it was
// set aside, in a few words.
func asideKind(e *logrus.Entry) string {
	why := fmt.Sprint(e.Data[logrus.ErrorKey])
	what := "other"
	switch {
	case strings.Contains(why, "/manifests/"):
		what = "manifest"
	case strings.Contains(why, "/blobs/"):
		what = "blob"
	}
	// A request that failed before its answer's headers names its URL (Get "…": ); one
	// whose answer's body failed does not.
	if strings.Contains(why, "Get \"https://") {
		what += " (request)"
	} else {
		what += " (body)"
	}
	// The reason, not the URL or the addresses it came from.
	why = urlOrAddrs.ReplaceAllString(why, "")
	switch {
	case strings.Contains(why, "sends nothing"):
		why = "took the request, sent nothing (15 s)"
	case strings.Contains(why, "context deadline exceeded"):
		why = "no answer in time (TLS handshake, 5 s)"
	case strings.Contains(why, "i/o timeout"):
		why = "dial timeout (3 s)"
	case strings.Contains(why, "busy for"):
		why = "busy for a minute"
	case strings.Contains(why, "sent nothing"):
		why = "stalled"
	case strings.Contains(why, "connection refused"), strings.Contains(why, "connection reset"):
		why = "connection refused or reset"
	default:
		if _, rest, ok := strings.Cut(why, "\": "); ok {
			why = rest // the error after the URL
		}
		if len(why) > 60 {
			why = why[:60] + "…"
		}
	}
	return what + ": " + why
}

func (w *warnCounter) Levels() []logrus.Level {
	return []logrus.Level{logrus.PanicLevel, logrus.FatalLevel, logrus.ErrorLevel, logrus.WarnLevel}
}

func (w *warnCounter) Fire(e *logrus.Entry) error {
	switch {
	case strings.Contains(e.Message, "setting a peer aside"):
		w.setAside.Add(1)
		w.mu.Lock()
		if w.asideWhy == nil {
			w.asideWhy = map[string]int64{}
		}
		w.asideWhy[asideKind(e)]++
		w.mu.Unlock()
	case strings.Contains(e.Message, "not served whole"):
		w.cut.Add(1)
	case strings.Contains(e.Message, "asking the registry for a blob"):
		w.mu.Lock()
		if len(w.climbed) < climbedKept {
			why := urlOrAddrs.ReplaceAllString(fmt.Sprint(e.Data[logrus.ErrorKey]), "")
			if len(why) > 600 {
				why = why[:600] + "…"
			}
			w.climbed = append(w.climbed, fmt.Sprintf("%v %.19v: %s", e.Data["node"], e.Data["blob"], strings.ReplaceAll(why, "\n", "; ")))
		}
		w.mu.Unlock()
		return nil
	default:
		w.other.Add(1)
	}
	w.mu.Lock()
	if len(w.samples) < 5 {
		msg := e.Message
		if err, ok := e.Data[logrus.ErrorKey]; ok {
			msg += fmt.Sprintf(": %v", err)
		}
		w.samples = append(w.samples, fmt.Sprintf("%v %s", e.Data["node"], msg))
	}
	w.mu.Unlock()
	return nil
}
