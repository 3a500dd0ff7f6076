package aggregator

import (
	"context"
	"errors"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Kubelet client certificates: CN system:node:<name>, O system:nodes.
const (
	nodeCNPrefix = "system:node:"
	nodesGroup   = "system:nodes"
)

// ErrNoIdentity means the peer presented no verified node certificate.
var ErrNoIdentity = errors.New("no verified node client certificate")

// NodeIdentity is the node name of the verified client certificate of a gRPC call.
func NodeIdentity(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", ErrNoIdentity
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", ErrNoIdentity
	}
	leaf := info.State.VerifiedChains[0][0]
	cn := leaf.Subject.CommonName
	if !strings.HasPrefix(cn, nodeCNPrefix) || len(cn) == len(nodeCNPrefix) {
		return "", errors.New("client certificate CN " + cn + " is not system:node:<name>")
	}
	if !slices.Contains(leaf.Subject.Organization, nodesGroup) {
		return "", errors.New("client certificate of " + cn + " is not in group system:nodes")
	}
	return strings.TrimPrefix(cn, nodeCNPrefix), nil
}
