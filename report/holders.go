package report

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"reflect"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	v1 "github.com/imagepin/imagepin/api/imagepinv1"
	"github.com/imagepin/imagepin/status"
)

// answerLifetime is how many heartbeats the aggregator's count is used without a new
// answer: as long as the aggregator counts a silent node among the live ones.
const answerLifetime = 3

// omitKnownTable leaves the table of blobs out of a report when the aggregator has it.
func (r *Reporter) omitKnownTable(report *v1.NodeReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := report.GetBlobs(); b != nil && r.known != nil && bytes.Equal(b.GetTableId(), r.known) {
		b.Table = nil
	}
}

// maxTableReport bounds a report carrying its table of blobs: the aggregator takes
// reports of up to 8 MiB, and a node pinning tens of thousands of images must still
// report its status.
const maxTableReport = 6 << 20

// boundTable leaves the blobs out of a report too large with them: the node's status
// still goes, and Holders says why there is no count.
func (r *Reporter) boundTable(report *v1.NodeReport) {
	if report.GetBlobs().GetTable() == nil {
		return
	}
	size := proto.Size(report)
	r.mu.Lock()
	defer r.mu.Unlock()
	if size <= maxTableReport {
		r.tooLarge = 0
		return
	}
	if r.tooLarge == 0 {
		r.log.WithField("bytes", size).WithField("images", len(report.GetBlobs().GetTable().GetImages())).
			Warn("the list of the pinned images' blobs is too large to report: the aggregator cannot count their holders")
	}
	r.tooLarge = size
	report.Blobs = nil
}

// answer takes the aggregator's answer to report: whether it has the table of blobs
// (else the next report, sent at once, carries it) and its count per set.
func (r *Reporter) answer(report *v1.NodeReport, ack *v1.ReportAck) {
	holders := map[string]status.BlobHolders{}
	for _, h := range ack.GetHolders() {
		holders[h.GetSet()] = h.GetHolders().ToStatus()
	}
	r.mu.Lock()
	switch b := report.GetBlobs(); {
	case b == nil:
	case ack.GetWantBlobTable():
		r.known = nil
		select {
		case r.changed <- struct{}{}:
		default:
		}
	case ack.GetAccepted() && b.GetTable() != nil:
		r.known = b.GetTableId()
	}
	changed := !maps.EqualFunc(holders, r.holders, func(a, b status.BlobHolders) bool { return reflect.DeepEqual(a, b) }) || r.holders == nil
	r.holders, r.answered, r.lastErr = holders, time.Now(), nil
	r.mu.Unlock()
	if changed && r.cfg.OnHolders != nil {
		r.cfg.OnHolders()
	}
}

// failed notes a report that got no answer: once the last count is too old to be used,
// it is dropped (OnHolders).
func (r *Reporter) failed(err error) {
	r.mu.Lock()
	r.lastErr = err
	expired := r.holders != nil && time.Since(r.answered) > answerLifetime*r.cfg.Heartbeat
	if expired {
		r.holders = nil
	}
	r.mu.Unlock()
	if expired && r.cfg.OnHolders != nil {
		r.cfg.OnHolders()
	}
}

// Holders is the aggregator's last count of the holders of every blob of set's images,
// or Unknown saying why there is none: no answer yet, none for too long, an aggregator
// that does not count, a set it has not counted yet.
func (r *Reporter) Holders(set string) status.BlobHolders {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.tooLarge > 0:
		return status.HoldersUnknown(fmt.Sprintf("the list of this node's pinned images' blobs (%d bytes in a report) is too large to send to the aggregator (%d at most)", r.tooLarge, maxTableReport))
	case r.holders == nil && r.answered.IsZero():
		why := "no answer from the aggregator yet"
		if r.lastErr != nil {
			why += fmt.Sprintf(" (%v)", r.lastErr)
		}
		return status.HoldersUnknown(why)
	case r.holders == nil || time.Since(r.answered) > answerLifetime*r.cfg.Heartbeat:
		why := fmt.Sprintf("no answer from the aggregator since %s", r.answered.UTC().Format(time.RFC3339))
		if r.lastErr != nil {
			why += fmt.Sprintf(" (%v)", r.lastErr)
		}
		return status.HoldersUnknown(why)
	case len(r.holders) == 0:
		return status.HoldersUnknown("the aggregator does not count the holders of blobs (older than this imagepind)")
	}
	h, ok := r.holders[set]
	if !ok {
		return status.HoldersUnknown("the aggregator has not counted this set yet")
	}
	return h
}

// AskHolders asks the aggregator once for the count of the holders of every blob of
// images (imagepinctl check --registry-gone), with cfg's certificate.
func AskHolders(ctx context.Context, cfg Config, images []string) (status.BlobHolders, error) {
	r := &Reporter{cfg: cfg}
	tlsConfig, err := r.tlsConfig()
	if err != nil {
		return status.BlobHolders{}, err
	}
	conn, err := grpc.NewClient(cfg.Aggregator, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)))
	if err != nil {
		return status.BlobHolders{}, fmt.Errorf("aggregator %s: %w", cfg.Aggregator, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, err := v1.NewReportsClient(conn).Holders(ctx, &v1.HoldersRequest{Images: images})
	if err != nil {
		return status.BlobHolders{}, fmt.Errorf("aggregator %s: holders: %w", cfg.Aggregator, err)
	}
	return h.ToStatus(), nil
}
