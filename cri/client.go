package cri

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/imagepin/imagepin/failure"
	"github.com/imagepin/imagepin/pullcreds"
)

// ErrUnavailable means the runtime did not answer (down, restarting, socket missing). It
// is failure.ErrRuntimeUnavailable, which failure.Classify takes for transient.
var ErrUnavailable = failure.ErrRuntimeUnavailable

// Image is what the runtime knows of one image.
type Image struct {
	Present bool
	Pinned  bool
	ID      string
	Size    uint64
}

// Version is the runtime's name and version.
type Version struct {
	Name    string
	Version string
}

// FsInfo is the runtime's image filesystem.
type FsInfo struct {
	Mountpoint string
	UsedBytes  uint64
}

// Client is a CRI client on a unix socket. It reconnects by itself (gRPC does).
type Client struct {
	conn    *grpc.ClientConn
	images  runtimeapi.ImageServiceClient
	runtime runtimeapi.RuntimeServiceClient
}

// Dial creates a client for endpoint ("unix:///var/run/crio/crio.sock"). It does not
// wait for the runtime: calls fail with ErrUnavailable until it answers.
func Dial(endpoint string) (*Client, error) {
	if !strings.HasPrefix(endpoint, "unix://") {
		return nil, fmt.Errorf("CRI endpoint %q: only unix:// sockets are supported", endpoint)
	}
	conn, err := grpc.NewClient(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
	)
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", endpoint, err)
	}
	return &Client{conn: conn, images: runtimeapi.NewImageServiceClient(conn), runtime: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Version asks the runtime for its name and version.
func (c *Client) Version(ctx context.Context) (Version, error) {
	resp, err := c.runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return Version{}, convert("version", err)
	}
	return Version{Name: resp.RuntimeName, Version: resp.RuntimeVersion}, nil
}

// RuntimeVersion is the runtime's version alone ("1.36.3"), as Version reports it.
func (c *Client) RuntimeVersion(ctx context.Context) (string, error) {
	v, err := c.Version(ctx)
	return v.Version, err
}

// ImageStatus reports whether ref is present and pinned. An absent image is not an error.
func (c *Client) ImageStatus(ctx context.Context, ref string) (Image, error) {
	resp, err := c.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return Image{}, convert("image status "+ref, err)
	}
	img := resp.GetImage()
	if img == nil {
		return Image{}, nil
	}
	return Image{Present: true, Pinned: img.Pinned, ID: img.Id, Size: img.Size}, nil
}

// ImageNames maps every name the runtime has an image under (repo digests and repo
// tags, spelled as it lists them) to the image's ID, with one ListImages call: how
// imagepind sees, cheaply, that an image it pulled was removed behind its back (crictl
// rmi, podman rmi on CRI-O's storage), and the IDs the kubelet's pull records are keyed
// by. The names are not case-folded: the runtime finds an image by its name's exact
// spelling (containers/storage's names, containerd's image records), and the kubelet
// asks it by the pod's image as written, so quay.io/x/a:V1 is another name than
// quay.io/x/a:v1.
func (c *Client) ImageNames(ctx context.Context) (map[string]string, error) {
	resp, err := c.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, convert("list images", err)
	}
	names := map[string]string{}
	for _, img := range resp.GetImages() {
		for _, n := range img.GetRepoDigests() {
			names[n] = img.GetId()
		}
		for _, n := range img.GetRepoTags() {
			names[n] = img.GetId()
		}
	}
	return names, nil
}

// PullImage pulls ref with the given credentials (nil: none) and returns the image ref.
func (c *Client) PullImage(ctx context.Context, ref string, auth *pullcreds.Auth) (string, error) {
	req := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}
	if auth != nil {
		req.Auth = &runtimeapi.AuthConfig{Username: auth.Username, Password: auth.Password}
	}
	resp, err := c.images.PullImage(ctx, req)
	if err != nil {
		return "", convert("pull "+ref, err)
	}
	return resp.ImageRef, nil
}

// ImageFsInfo returns the image filesystem's mountpoint and bytes used.
func (c *Client) ImageFsInfo(ctx context.Context) (FsInfo, error) {
	resp, err := c.images.ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		return FsInfo{}, convert("image fs info", err)
	}
	for _, fs := range resp.ImageFilesystems {
		return FsInfo{Mountpoint: fs.GetFsId().GetMountpoint(), UsedBytes: fs.GetUsedBytes().GetValue()}, nil
	}
	return FsInfo{}, errors.New("image fs info: runtime reported no image filesystem")
}

// PullError is a failed pull: Message is the runtime's text, word for word.
type PullError struct {
	Op      string
	Code    codes.Code
	Message string
}

func (e *PullError) Error() string { return e.Message }

func convert(op string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", op, err)
	}
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("%s: %w: %s", op, ErrUnavailable, st.Message())
	case codes.Canceled:
		return fmt.Errorf("%s: %w", op, context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w: %s", op, context.DeadlineExceeded, st.Message())
	}
	return &PullError{Op: op, Code: st.Code(), Message: st.Message()}
}

// ImageService is the part of CRI's image service imagepind uses: what the agent pins,
// pulls and watches through, and what the runtime port's conformance suite
// (pin/pintest) drives on real and fake runtimes alike. *Client is the real one.
type ImageService interface {
	Version(ctx context.Context) (Version, error)
	ImageStatus(ctx context.Context, ref string) (Image, error)
	PullImage(ctx context.Context, ref string, auth *pullcreds.Auth) (string, error)
	// ImageNames is one ListImages: every name the runtime has an image under, to its ID.
	ImageNames(ctx context.Context) (map[string]string, error)
}

var _ ImageService = (*Client)(nil)
