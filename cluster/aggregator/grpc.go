package aggregator

import (
	"context"
	"errors"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
)

// ReportService is the gRPC ingest: identity from the client certificate, the rest
// from the store.
type ReportService struct {
	v1.UnimplementedReportsServer
	Store *Store
	Log   logrus.FieldLogger
}

// Report ingests one node report.
func (r *ReportService) Report(ctx context.Context, req *v1.NodeReport) (*v1.ReportAck, error) {
	node, err := NodeIdentity(ctx)
	if err != nil {
		r.Log.WithError(err).Warn("report refused: no node identity")
		return nil, grpcstatus.Error(codes.Unauthenticated, err.Error())
	}
	accepted, err := r.Store.Ingest(node, req)
	switch {
	case errors.Is(err, ErrIdentity):
		r.Log.WithField("node", node).WithField("claimed", req.GetNode()).Warn("report refused: a node reports only for itself")
		return nil, grpcstatus.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, ErrTooMany):
		r.Log.WithField("node", node).Warn(err.Error())
		return nil, grpcstatus.Error(codes.ResourceExhausted, err.Error())
	case err != nil:
		r.Log.WithField("node", node).WithError(err).Warn("report refused")
		return nil, grpcstatus.Error(codes.InvalidArgument, err.Error())
	}
	ack := &v1.ReportAck{Accepted: accepted}
	if req.GetInfo().GetPeerAddress() != "" {
		// Only a node that shares asks for peers: the store's lock is not taken a second
		// time for every report of a cluster without them.
		ack.Peers = r.Store.Peers(node)
	}
	if req.GetBlobs() != nil {
		// Only a node that says what it holds gets the count back (an older one would
		// not read it).
		ack.Holders, ack.WantBlobTable = r.Store.Answer(node)
	}
	return ack, nil
}

// maxHoldersImages bounds the images one Holders request asks for.
const maxHoldersImages = maxTableImages

// Holders counts the holders of the blobs of the images a node asks for (its imagepinctl
// check --registry-gone): any node may ask, with its certificate.
func (r *ReportService) Holders(ctx context.Context, req *v1.HoldersRequest) (*v1.BlobHolders, error) {
	node, err := NodeIdentity(ctx)
	if err != nil {
		return nil, grpcstatus.Error(codes.Unauthenticated, err.Error())
	}
	if n := len(req.GetImages()); n > maxHoldersImages {
		r.Log.WithField("node", node).WithField("images", n).Warn("holders request refused: too many images")
		return nil, grpcstatus.Errorf(codes.InvalidArgument, "%d images, at most %d", n, maxHoldersImages)
	}
	return v1.FromHolders(r.Store.Holders(req.GetImages())), nil
}
