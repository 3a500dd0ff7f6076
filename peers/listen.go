package peers

import (
	"context"
	"errors"
	"net"
	"net/netip"

	"github.com/imagepin/imagepin/internal/httpserve"
	"github.com/imagepin/imagepin/internal/sockowner"
)

// Serve serves the node-local mirror to the runtime on Config.MirrorAddress until ctx
// ends. The mirror serves private images (fetched with the node's pull secret): on
// loopback only connections owned by root (the runtime) or by this process are
// answered.
func (n *Node) Serve(ctx context.Context) error {
	if n.local == nil {
		return errors.New("peers: the node-local mirror served before Bind")
	}
	l, err := net.Listen("tcp", n.cfg.MirrorAddress)
	if err != nil {
		return err
	}
	if ap, err := netip.ParseAddrPort(l.Addr().String()); err == nil && ap.Addr().IsLoopback() {
		l = &sockowner.Listener{Listener: l, Allow: n.allow, Log: n.log}
	}
	return httpserve.Serve(ctx, l, n.local)
}

// ServePeers serves the peers on Config.Address until ctx ends (at once when this node
// shares nothing). Its failing (the address taken) is logged and leaves the node-local
// mirror running: it returns nil.
func (n *Node) ServePeers(ctx context.Context) error {
	if n.server == nil {
		return nil
	}
	if err := n.server.Serve(ctx, n.cfg.Address, n.serverTLS); err != nil {
		n.log.WithError(err).Error("[peers] serving peers stopped; the node-local mirror works")
	}
	return nil
}
