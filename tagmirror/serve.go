package tagmirror

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

// Serve serves until ctx ends. On loopback only connections owned by root (the
// runtime) or by this process are answered, as on the plain mirror.
func (s *Server) Serve(ctx context.Context) error {
	host, _, err := net.SplitHostPort(s.Address)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", s.Address)
	if err != nil {
		return err
	}
	if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil && ap.Addr().IsLoopback() {
		l = &sockowner.Listener{Listener: l, Allow: sockowner.RootOrSelf, Log: s.Log}
	}
	return httpserve.Serve(ctx, tls.NewListener(l, s.CA.ServerTLS(host)), s.Handler)
}
