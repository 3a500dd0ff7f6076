package aggregator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
)

// MaxReportBytes bounds one report on the wire.
const MaxReportBytes = 8 << 20

// ServerTLS is the gRPC listener's mTLS: its serving certificate (re-read on every
// handshake, so a rotated certificate is picked up) and the CA that signs the nodes'
// client certificates (the cluster's kubelet client CA).
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("client CA %s: no PEM certificate", clientCAFile)
	}
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  pool,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			return &c, err
		},
	}, nil
}

// ServeGRPC serves the ingest on l until ctx ends, then stops gracefully.
func ServeGRPC(ctx context.Context, l net.Listener, tlsConfig *tls.Config, store *Store, log logrus.FieldLogger) error {
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		grpc.MaxRecvMsgSize(MaxReportBytes),
		// One long-lived connection per node: gRPC's default 32 KiB read and write
		// buffers cost 320 MiB at 5,000 nodes; a report is a few KiB. The write buffer
		// is taken from a shared pool for each flush and given back (an idle node's
		// connection holds none), and streams are served by a fixed pool of workers
		// rather than a new goroutine each.
		grpc.ReadBufferSize(4<<10),
		// HPACK's dynamic table, 4 KiB a connection by default: a report's few headers
		// fit in 512 bytes.
		grpc.HeaderTableSize(512),
		grpc.WriteBufferSize(8<<10),
		grpc.SharedWriteBuffer(true),
		grpc.NumStreamWorkers(uint32(runtime.NumCPU())),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	v1.RegisterReportsServer(srv, &ReportService{Store: store, Log: log})
	go func() {
		<-ctx.Done()
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// ReadTLS is the read listener's TLS: the same serving certificate as the report
// listener (re-read on every handshake). Client certificates are asked for, and checked
// by the read side's gate (package readauth), only when requestClientCerts.
func ReadTLS(certFile, keyFile string, requestClientCerts bool) (*tls.Config, error) {
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			return &c, err
		},
	}
	if requestClientCerts {
		c.ClientAuth = tls.RequestClientCert
	}
	return c, nil
}

// ServeHTTP serves the read side (h: ReadHandler behind its gate) over TLS on l until
// ctx ends. Every phase of a request has a deadline: a client that opens connections
// and sends nothing, or reads nothing, holds them for seconds, not forever.
func ServeHTTP(ctx context.Context, l net.Listener, h http.Handler, tlsConfig *tls.Config) error {
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
