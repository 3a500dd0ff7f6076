// Command imagepin-aggregator collects every node's imagepind report and answers, per
// set, which nodes are ready, which fail and why. See the README.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/imagepin/imagepin/api/v1alpha1"
	"github.com/imagepin/imagepin/cluster/aggregator"
	"github.com/imagepin/imagepin/cluster/clusterstatus"
	"github.com/imagepin/imagepin/cluster/readauth"
	"github.com/imagepin/imagepin/cluster/replica"
	"github.com/imagepin/imagepin/cluster/starttaint"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/internal/kube"
	"github.com/imagepin/imagepin/internal/leader"
)

var version = "0.1.0-dev"

type options struct {
	grpcAddress, httpAddress  string
	tlsCert, tlsKey, clientCA string
	readClientCA              string
	expectedNodes             string
	stateFile                 string
	flushInterval             time.Duration
	forgetAfter               time.Duration
	maxNodes, maxSets         int

	// The cluster loop.
	cluster                             bool
	kubeconfig                          string
	leaderElect                         bool
	leaseNamespace, leaseName, identity string
	leaseDuration, renewDeadline, retry time.Duration
	statusMinInterval, statusWarmup     time.Duration
	statusQPS                           float64
	startupTaint                        string
}

func main() {
	var o options
	defineFlags(flag.CommandLine, &o)
	logLevel := flag.String("log-level", "info", "log level")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	log := logrus.New()
	if lvl, err := logrus.ParseLevel(*logLevel); err == nil {
		log.SetLevel(lvl)
	}
	// Most of the aggregator's memory is its nodes' connections, which live; what reports
	// leave behind is short-lived. Collect when the heap has grown by a quarter, not
	// doubled (GOGC, when set, decides instead): `make bench-aggregator`, 5,000 nodes at
	// 5,400 reports/s: peak RSS 446 MiB at Go's default, 322 at 50, 286 at 25.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.WithError(err).Error("imagepin-aggregator stopped")
		os.Exit(1)
	}
}

// defineFlags registers the flags (also used by the test that checks the manifests).
func defineFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.grpcAddress, "grpc-address", ":9443", "report listener (gRPC, mTLS: node client certificates)")
	fs.StringVar(&o.httpAddress, "http-address", "", "read listener (HTTPS: the page, /v1/sets, /v1/nodes, /metrics, /healthz, /readyz); default :9444 with --cluster (bearer tokens checked with TokenReview, access with SubjectAccessReview), else 127.0.0.1:9444")
	fs.StringVar(&o.readClientCA, "read-client-ca", "", "optional CA whose client certificates may read the read side (without --cluster: required to listen beyond loopback)")
	fs.StringVar(&o.tlsCert, "tls-cert", "/etc/imagepin-aggregator/tls/tls.crt", "serving certificate of the report listener")
	fs.StringVar(&o.tlsKey, "tls-key", "/etc/imagepin-aggregator/tls/tls.key", "its key")
	fs.StringVar(&o.clientCA, "client-ca", "/etc/imagepin-aggregator/kubelet-client-ca/ca-bundle.crt", "CA of the nodes' client certificates (the kubelet client CA)")
	fs.StringVar(&o.expectedNodes, "expected-nodes", "", "optional file of node names, one a line: nodes that never reported count as Unknown")
	fs.StringVar(&o.stateFile, "state-file", "", "optional bbolt file keeping the last reports across restarts (heartbeats stay the truth)")
	fs.DurationVar(&o.flushInterval, "flush-interval", 5*time.Second, "how often changed reports are written to --state-file")
	fs.DurationVar(&o.forgetAfter, "forget-after", 24*time.Hour, "a node silent this long is forgotten, from memory and --state-file (0: never); with --cluster, a node deleted from the API is forgotten once it is Unknown")
	fs.IntVar(&o.maxNodes, "max-nodes", aggregator.DefaultLimits().MaxNodes, "nodes the aggregator keeps at most")
	fs.IntVar(&o.maxSets, "max-sets-per-report", aggregator.DefaultLimits().MaxSetsPerReport, "sets one report may carry")

	fs.BoolVar(&o.cluster, "cluster", false, "use the Kubernetes API: targets from PinnedImageSet selectors and Node labels, rollups written to each set's status")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "with --cluster: a kubeconfig file (empty: the pod's service account)")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "with --cluster: take reports and write status only while holding the Lease (run two replicas)")
	fs.StringVar(&o.leaseNamespace, "leader-elect-namespace", envOr("POD_NAMESPACE", "imagepin"), "namespace of the Lease")
	fs.StringVar(&o.leaseName, "leader-elect-name", "imagepin-aggregator", "name of the Lease")
	fs.StringVar(&o.identity, "leader-elect-identity", envOr("POD_NAME", hostname()), "this replica's identity in the Lease")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after the last renewal before taking over")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader tries to renew before giving up")
	fs.DurationVar(&o.retry, "leader-elect-retry-period", 2*time.Second, "how often to try to acquire or renew")
	fs.DurationVar(&o.statusMinInterval, "status-min-interval", 10*time.Second, "a set's status is written at most this often")
	fs.Float64Var(&o.statusQPS, "status-qps", 5, "status writes per second across all sets, at most")
	fs.DurationVar(&o.statusWarmup, "status-warmup", 45*time.Second, "a new leader writes no status until every Node reported, or this long")
	fs.StringVar(&o.startupTaint, "startup-taint", starttaint.DefaultKey, "with --cluster: the leader removes taints with this key from a Node once its "+v1alpha1.NodeConditionPinnedImagesReady+" condition is True (empty: never)")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func run(ctx context.Context, o options, log *logrus.Logger) error {
	if err := resolveReadAddress(&o); err != nil {
		return err
	}
	limits := aggregator.DefaultLimits()
	limits.MaxNodes, limits.MaxSetsPerReport = o.maxNodes, o.maxSets
	store := aggregator.NewStore(limits, time.Now)
	if o.expectedNodes != "" {
		data, err := fsutil.ReadRegular(o.expectedNodes, 16<<20)
		if err != nil {
			return fmt.Errorf("expected nodes: %w", err)
		}
		nodes := aggregator.ReadExpectedNodes(data)
		store.SetExpected(nodes)
		log.WithField("nodes", len(nodes)).Info("expected nodes")
	}
	var persister *aggregator.Persister
	if o.stateFile != "" {
		p, err := aggregator.OpenPersister(o.stateFile, store, o.flushInterval, log)
		if err != nil {
			return err
		}
		n, err := p.Load()
		if err != nil {
			log.WithError(err).Warn("state file partly read")
		}
		log.WithField("nodes", n).Info("reports restored from the state file")
		persister = p
	}
	tlsConfig, err := aggregator.ServerTLS(o.tlsCert, o.tlsKey, o.clientCA)
	if err != nil {
		return err
	}
	var rc *rest.Config
	if o.cluster {
		if rc, err = kube.Config(o.kubeconfig, "imagepin-aggregator/"+version, 20, 40); err != nil {
			return err
		}
	}
	readTLS, err := aggregator.ReadTLS(o.tlsCert, o.tlsKey, o.readClientCA != "")
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", o.httpAddress)
	if err != nil {
		return err
	}
	log.WithField("grpc", o.grpcAddress).WithField("http", hl.Addr().String()).WithField("version", version).Info("imagepin-aggregator listening")
	// Reports are taken only while leading (or always, without leader election): the
	// standby does not listen, and its /readyz says so, so the Service sends nodes to one.
	rcfg := replica.Config{Serve: func(ctx context.Context, ready func()) error {
		gl, err := net.Listen("tcp", o.grpcAddress)
		if err != nil {
			return err
		}
		log.WithField("grpc", gl.Addr().String()).Info("taking reports")
		ready()
		return aggregator.ServeGRPC(ctx, gl, tlsConfig, store, log)
	}}
	var loop *clusterstatus.Loop
	if o.cluster {
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			return err
		}
		meta, err := metadata.NewForConfig(rc)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return err
		}
		events, stopEvents := eventRecorder(cs)
		defer stopEvents()
		loop = clusterstatus.New(dyn, meta, store, clusterstatus.Config{
			MinInterval: o.statusMinInterval, QPS: o.statusQPS, Warmup: o.statusWarmup, Log: log, Events: events,
		})
		rcfg.Write = loop.Lead
		if o.startupTaint != "" {
			taints := starttaint.New(cs, events, starttaint.Config{Key: o.startupTaint, Condition: v1alpha1.NodeConditionPinnedImagesReady, Log: log})
			rcfg.Write = both(loop.Lead, taints.Lead)
		}
		if o.leaderElect {
			rcfg.Elect = func(ctx context.Context, lead func(context.Context)) error {
				return leader.Run(ctx, rc, leader.Config{
					Namespace: o.leaseNamespace, Name: o.leaseName, Identity: o.identity,
					LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, Retry: o.retry, Log: log,
				}, lead)
			}
		}
	}
	rep := replica.New(rcfg)
	readSide, err := readHandler(o, rc, store, rep.Leading, log)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return aggregator.ServeHTTP(ctx, hl, readSide, readTLS) })
	g.Go(func() error { return store.RunForget(ctx, o.forgetAfter, log) })
	if persister != nil {
		g.Go(func() error { return persister.Run(ctx) })
	}
	if loop != nil {
		// Both replicas run the informers: the standby's JSON API stays right and a
		// takeover starts warm.
		g.Go(func() error { return loop.Run(ctx) })
	}
	g.Go(func() error { return rep.Run(ctx) })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// both runs the leader's writers side by side; the first error ends both.
func both(a, b func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return a(ctx) })
		g.Go(func() error { return b(ctx) })
		return g.Wait()
	}
}

// eventRecorder records Events (core/v1) through client-go's correlator, which
// aggregates similar events and rate-limits each object's.
func eventRecorder(cs kubernetes.Interface) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "imagepin-aggregator"}), b.Shutdown
}

// resolveReadAddress picks the read listener's default and refuses a read side open to
// anyone: without the API (no TokenReview, no RBAC) it listens beyond loopback only
// when client certificates are required.
func resolveReadAddress(o *options) error {
	if o.httpAddress == "" {
		o.httpAddress = "127.0.0.1:9444"
		if o.cluster {
			o.httpAddress = ":9444"
		}
	}
	if o.cluster || o.readClientCA != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(o.httpAddress)
	if err != nil {
		return fmt.Errorf("--http-address %q: %w", o.httpAddress, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--http-address %s would open node names, images and errors to anyone who reaches it: "+
		"without --cluster (tokens and RBAC) bind it to loopback, or set --read-client-ca to require client certificates", o.httpAddress)
}

// readHandler is the read side behind its gate: with the API (rc), tokens checked by
// TokenReview and access by SubjectAccessReview; client certificates of --read-client-ca
// when set; the probes open.
func readHandler(o options, rc *rest.Config, store *aggregator.Store, ready func() bool, log logrus.FieldLogger) (http.Handler, error) {
	cfg := readauth.Config{ClientCAFile: o.readClientCA, Open: []string{"/healthz", "/readyz"}, Log: log}
	if rc != nil {
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, err
		}
		cfg.Kube = cs
	}
	guard, err := readauth.New(cfg)
	if err != nil {
		return nil, err
	}
	return guard.Handler(aggregator.ReadHandler(store, ready)), nil
}
