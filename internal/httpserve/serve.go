// Package httpserve runs a plain-HTTP handler on a local address for the life of a
// context: imagepind's metrics and its node-local mirror.
package httpserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Run listens on address and serves h until ctx ends, then shuts the server down
// (letting requests in flight finish for up to 5 s).
func Run(ctx context.Context, address string, h http.Handler) error {
	l, err := net.Listen("tcp", address)
	if err != nil {
		return err
	}
	return Serve(ctx, l, h)
}

// Serve serves h on l until ctx ends, as Run does.
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
