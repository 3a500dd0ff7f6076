package endpoint

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/internal/httpserve"
	"github.com/imagepin/imagepin/internal/sockowner"
)

// Server is the tag endpoint: Handler (the node-local mirror with tags,
// mirror.WithTags) over TLS on Address, with the CA's certificate for its host.
type Server struct {
	Address string
	CA      *CA
	Handler http.Handler
	Log     logrus.FieldLogger
}

// Serve listens and serves until ctx ends (Listen, then ServeOn).
func (s *Server) Serve(ctx context.Context) error {
	l, err := s.Listen()
	if err != nil {
		return err
	}
	return s.ServeOn(ctx, l)
}

// Listen binds Address, speaking TLS with the CA's certificate for its host. On
// loopback only connections owned by root (the runtime) or by this process are
// answered, as on the plain mirror.
func (s *Server) Listen() (net.Listener, error) {
	host, _, err := net.SplitHostPort(s.Address)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", s.Address)
	if err != nil {
		return nil, err
	}
	if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil && ap.Addr().IsLoopback() {
		l = &sockowner.Listener{Listener: l, Allow: sockowner.RootOrSelf, Log: s.Log}
	}
	return tls.NewListener(l, s.CA.ServerTLS(host)), nil
}

// ServeOn serves on l (Listen's) until ctx ends.
func (s *Server) ServeOn(ctx context.Context, l net.Listener) error {
	return httpserve.Serve(ctx, l, s.Handler)
}
