package aggregator

import (
	"context"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/imagepin/imagepin/internal/nodecert"
)

// ErrNoIdentity means the peer presented no verified node certificate.
var ErrNoIdentity = nodecert.ErrNone

// NodeIdentity is the node name of the verified client certificate of a gRPC call.
func NodeIdentity(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", ErrNoIdentity
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", ErrNoIdentity
	}
	return nodecert.Name(info.State.VerifiedChains)
}
