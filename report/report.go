package report

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/internal/nodecert"
	"github.com/imagepin/imagepin/status"
)

// Config is [report].
type Config struct {
	// Aggregator is host:port of its gRPC listener.
	Aggregator string
	Heartbeat  time.Duration
	// CertFile holds the client certificate, KeyFile its key ("": in CertFile, one PEM,
	// as the kubelet's kubelet-client-current.pem); re-read at every handshake, so
	// rotation is followed.
	CertFile, KeyFile string
	// CAFile is the CA of the aggregator's serving certificate ("" = system roots).
	CAFile string
	// ServerName is the name verified in the aggregator's certificate ("" = the host of
	// Aggregator): nodes reach it by a NodePort but its certificate names the service.
	ServerName string
	// OnPeers, when set, takes the peers each report's answer carries (the nodes that
	// pin the same sets and share them, [peers]).
	OnPeers func([]string)
	// OnHolders, when set, is called when the count of the holders of the sets' blobs
	// (Holders) changed: a new answer, or the last one too old to be used.
	OnHolders func()
}

// Reporter sends the latest status.
type Reporter struct {
	cfg Config
	log logrus.FieldLogger

	mu      sync.Mutex
	latest  *status.Node
	changed chan struct{}
	// known is the id of the table of blobs the aggregator has: reports carry the id
	// alone until it asks for the table again.
	known []byte
	// holders is the aggregator's last count per set, answered at answered; lastErr
	// is why no answer came since.
	holders  map[string]status.BlobHolders
	answered time.Time
	lastErr  error
	// tooLarge is the size of the last report whose table of blobs was left out, too
	// large to send (0: none).
	tooLarge int
}

// New returns a reporter; Run starts it.
func New(cfg Config, log logrus.FieldLogger) *Reporter {
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 30 * time.Second
	}
	return &Reporter{cfg: cfg, log: log, changed: make(chan struct{}, 1)}
}

// Update replaces the status to send; it never blocks.
func (r *Reporter) Update(n status.Node) {
	r.mu.Lock()
	r.latest = &n
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// Run sends on every change and every heartbeat until ctx ends. Failures are retried
// with backoff, always with the latest status.
func (r *Reporter) Run(ctx context.Context) error {
	tlsConfig, err := r.waitForTLS(ctx)
	if err != nil || ctx.Err() != nil {
		return err
	}
	// gRPC redials a lost connection with its own backoff, up to 120 s by default; a new
	// aggregator leader waits 1.5 heartbeats for every node before it writes status, so a
	// node must be back within a heartbeat: redial at most a heartbeat apart.
	redial := backoff.DefaultConfig
	redial.MaxDelay = max(r.cfg.Heartbeat, redial.BaseDelay)
	// ConnectParams replaces every dial setting: MinConnectTimeout stays gRPC's default.
	conn, err := grpc.NewClient(r.cfg.Aggregator, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: redial, MinConnectTimeout: 20 * time.Second}))
	if err != nil {
		return fmt.Errorf("aggregator %s: %w", r.cfg.Aggregator, err)
	}
	defer conn.Close()
	client := v1.NewReportsClient(conn)
	bootID := readBootID()

	heartbeat := time.NewTicker(r.cfg.Heartbeat)
	defer heartbeat.Stop()
	var retry <-chan time.Time
	retryIn := time.Second
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.changed:
		case <-heartbeat.C:
		case <-retry:
		}
		r.mu.Lock()
		n := r.latest
		r.mu.Unlock()
		if n == nil {
			continue
		}
		report := v1.FromStatus(*n, bootID, sequence(), r.cfg.Heartbeat)
		r.omitKnownTable(report)
		r.boundTable(report)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ack, err := client.Report(sctx, report)
		cancel()
		if err == nil && r.cfg.OnPeers != nil {
			r.cfg.OnPeers(ack.GetPeers())
		}
		if err == nil {
			r.answer(report, ack)
		} else {
			r.failed(err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !failing {
				r.log.WithError(err).WithField("aggregator", r.cfg.Aggregator).Warn("report failed; retrying with the latest status")
			}
			failing = true
			retry = time.After(retryIn)
			retryIn = min(retryIn*2, r.cfg.Heartbeat)
			continue
		}
		if failing {
			r.log.WithField("aggregator", r.cfg.Aggregator).Info("reporting again")
		}
		failing, retry, retryIn = false, nil, time.Second
	}
}

// waitForTLS reads the CA and the client certificate, retrying with backoff while they
// are missing or broken: on a fresh node the certificate appears once its CSR is
// approved, and reporting must start then, not stay off for the life of the process.
func (r *Reporter) waitForTLS(ctx context.Context) (*tls.Config, error) {
	backoff := time.Second
	logged := ""
	for {
		cfg, err := r.tlsConfig()
		if err == nil {
			if logged != "" {
				r.log.Info("report client certificate available")
			}
			return cfg, nil
		}
		if err.Error() != logged {
			r.log.WithError(err).Warn("cannot report yet; retrying until the certificate is there")
			logged = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, r.cfg.Heartbeat)
	}
}

func (r *Reporter) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.cfg.ServerName}
	if r.cfg.CAFile != "" {
		pemBytes, err := os.ReadFile(r.cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("report CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemBytes) {
			return nil, fmt.Errorf("report CA %s: no PEM certificate", r.cfg.CAFile)
		}
		cfg.RootCAs = pool
	}
	load := nodecert.KeyPair(r.cfg.CertFile, r.cfg.KeyFile)
	if _, err := load(); err != nil {
		return nil, fmt.Errorf("report client certificate %s: %w", r.cfg.CertFile, err)
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }
	return cfg, nil
}

// readBootID is the kernel's boot id: a new boot is a new sequence space.
func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return "unknown-boot"
	}
	return strings.TrimSpace(string(b))
}

// sequence grows within a boot, across restarts of imagepind too: CLOCK_BOOTTIME.
func sequence() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return uint64(time.Now().UnixNano())
	}
	return uint64(ts.Nano())
}
