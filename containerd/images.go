package containerd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	typesapi "github.com/containerd/containerd/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/imagepin/imagepin/cri"
)

// The label containerd's CRI plugin reads as "pinned" (internal/cri/labels in 2.x,
// pkg/cri/labels in 1.7), and the namespace its images live in.
const (
	PinnedLabel      = "io.cri-containerd.pinned"
	PinnedLabelValue = "pinned"
	DefaultNamespace = "k8s.io"
)

// ErrNotFound means there is no image record of that name.
var ErrNotFound = errors.New("no such image")

// Images is containerd's images API on its socket, in one namespace: the labels of an
// image record, and the pinned label set or removed.
type Images struct {
	conn      *grpc.ClientConn
	client    imagesapi.ImagesClient
	namespace string

	// targets are the records' targets last read, by name: a label update carries the
	// target (see SetPinned), and for a reference by digest it never changes, so the
	// read before an update is spared when Labels has just read it.
	mu      sync.Mutex
	targets map[string]*typesapi.Descriptor
	// callTimeout overrides CallTimeout (tests).
	callTimeout time.Duration
}

// DialImages connects to containerd's API socket ("unix:///run/containerd/containerd.sock"
// or a path). Like cri.Dial it does not wait: calls fail until containerd answers.
func DialImages(address, namespace string) (*Images, error) {
	conn, namespace, err := dial(address, namespace)
	if err != nil {
		return nil, err
	}
	return &Images{conn: conn, client: imagesapi.NewImagesClient(conn), namespace: namespace, targets: map[string]*typesapi.Descriptor{}}, nil
}

// dial makes a client of containerd's API socket (a path or unix://path), with the
// namespace ("": DefaultNamespace); it does not wait.
func dial(address, namespace string) (*grpc.ClientConn, string, error) {
	if !strings.HasPrefix(address, "unix://") {
		address = "unix://" + address
	}
	if namespace == "" {
		namespace = DefaultNamespace
	}
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, "", fmt.Errorf("containerd client for %s: %w", address, err)
	}
	return conn, namespace, nil
}

// Close closes the connection.
func (i *Images) Close() error { return i.conn.Close() }

// CallTimeout bounds each call to containerd's image service: the pinner's calls run on
// imagepind's reconcile loop, and a containerd that accepts a call and never answers
// must not stop the loop, its heartbeat and the watchdog feeding with it.
const CallTimeout = 10 * time.Second

// call adds the namespace header containerd's own client sends
// (namespaces.WithNamespace: gRPC metadata "containerd-namespace") and a deadline of
// callTimeout (CallTimeout unless set) when ctx has none sooner.
func (i *Images) call(ctx context.Context) (context.Context, context.CancelFunc) {
	d := i.callTimeout
	if d <= 0 {
		d = CallTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return metadata.AppendToOutgoingContext(ctx, "containerd-namespace", i.namespace), cancel
}

// Labels returns the labels of the image record name; ErrNotFound when there is none.
func (i *Images) Labels(ctx context.Context, name string) (map[string]string, error) {
	cctx, cancel := i.call(ctx)
	defer cancel()
	resp, err := i.client.Get(cctx, &imagesapi.GetImageRequest{Name: name})
	if err != nil {
		return nil, convert("get image "+name, err)
	}
	if t := resp.GetImage().GetTarget(); t != nil && strings.Contains(name, "@") {
		i.mu.Lock()
		if len(i.targets) > 10000 {
			clear(i.targets)
		}
		i.targets[name] = t
		i.mu.Unlock()
	}
	labels := resp.GetImage().GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	return labels, nil
}

// SetPinned sets (pinned) or removes the pinned label of the image record name, leaving
// every other field and label as it is: an update with the label's field path alone.
// The update carries the record's target as read, as containerd's own client sends it:
// containerd 2.2 dereferences the target of every update, and one without it panics
// the whole daemon (images.imageFromProto), so the record is read first.
func (i *Images) SetPinned(ctx context.Context, name string, pinned bool) error {
	i.mu.Lock()
	target := i.targets[name]
	i.mu.Unlock()
	if target == nil {
		cctx, cancel := i.call(ctx)
		resp, err := i.client.Get(cctx, &imagesapi.GetImageRequest{Name: name})
		cancel()
		if err != nil {
			return convert("get image "+name, err)
		}
		if target = resp.GetImage().GetTarget(); target == nil {
			return fmt.Errorf("label image %s: containerd returned a record without a target", name)
		}
	}
	labels := map[string]string{}
	if pinned {
		labels[PinnedLabel] = PinnedLabelValue
	}
	cctx, cancel := i.call(ctx)
	defer cancel()
	_, err := i.client.Update(cctx, &imagesapi.UpdateImageRequest{
		Image:      &imagesapi.Image{Name: name, Target: target, Labels: labels},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels." + PinnedLabel}},
	})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			i.mu.Lock()
			delete(i.targets, name)
			i.mu.Unlock()
		}
		return convert("label image "+name, err)
	}
	return nil
}

func convert(op string, err error) error {
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return fmt.Errorf("%s: %v: %w", op, err, cri.ErrUnavailable)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Record is an image record as the tag records need it: its target and labels.
type Record struct {
	Target *typesapi.Descriptor
	Labels map[string]string
}

// Get returns the image record name; ErrNotFound when there is none.
func (i *Images) Get(ctx context.Context, name string) (Record, error) {
	cctx, cancel := i.call(ctx)
	defer cancel()
	resp, err := i.client.Get(cctx, &imagesapi.GetImageRequest{Name: name})
	if err != nil {
		return Record{}, convert("get image "+name, err)
	}
	img := resp.GetImage()
	if img.GetTarget() == nil {
		return Record{}, fmt.Errorf("get image %s: containerd returned a record without a target", name)
	}
	return Record{Target: img.GetTarget(), Labels: img.GetLabels()}, nil
}

// Put makes the image record name hold r: created, else its target and labels
// replaced (other labels of an existing record are dropped).
func (i *Images) Put(ctx context.Context, name string, r Record) error {
	img := &imagesapi.Image{Name: name, Target: r.Target, Labels: r.Labels}
	cctx, cancel := i.call(ctx)
	_, err := i.client.Create(cctx, &imagesapi.CreateImageRequest{Image: img})
	cancel()
	if status.Code(err) != codes.AlreadyExists {
		return convertPut(name, err)
	}
	cctx, cancel = i.call(ctx)
	defer cancel()
	_, err = i.client.Update(cctx, &imagesapi.UpdateImageRequest{Image: img,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"target", "labels"}}})
	return convertPut(name, err)
}

func convertPut(name string, err error) error {
	if err == nil {
		return nil
	}
	return convert("put image "+name, err)
}

// Delete removes the image record name (not its content: containerd's garbage
// collector keeps what another record names).
func (i *Images) Delete(ctx context.Context, name string) error {
	cctx, cancel := i.call(ctx)
	defer cancel()
	_, err := i.client.Delete(cctx, &imagesapi.DeleteImageRequest{Name: name})
	if err != nil && status.Code(err) != codes.NotFound {
		return convert("delete image "+name, err)
	}
	return nil
}

// Labeled are the names of the image records that carry label.
func (i *Images) Labeled(ctx context.Context, label string) ([]string, error) {
	cctx, cancel := i.call(ctx)
	defer cancel()
	resp, err := i.client.List(cctx, &imagesapi.ListImagesRequest{Filters: []string{fmt.Sprintf("labels.%q", label)}})
	if err != nil {
		return nil, convert("list images labelled "+label, err)
	}
	var names []string
	for _, img := range resp.GetImages() {
		names = append(names, img.GetName())
	}
	return names, nil
}
