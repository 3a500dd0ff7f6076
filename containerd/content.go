package containerd

import (
	"context"
	"io"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/content/proxy"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Content reads containerd's content store over its API: the compressed blobs (and
// manifests) of its images, which a containerd node's mirror serves instead of keeping a
// second copy ([peers]).
type Content struct {
	conn      *grpc.ClientConn
	store     content.Store
	namespace string
}

// DialContent connects to containerd's API socket; calls fail until containerd answers.
func DialContent(address, namespace string) (*Content, error) {
	conn, namespace, err := dial(address, namespace)
	if err != nil {
		return nil, err
	}
	return &Content{conn: conn, store: proxy.NewContentStore(contentapi.NewContentClient(conn)), namespace: namespace}, nil
}

// Close closes the connection.
func (c *Content) Close() error { return c.conn.Close() }

func (c *Content) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "containerd-namespace", c.namespace)
}

// Reader reads blob d from containerd's content store; an error when it has none
// (errdefs.IsNotFound), or when containerd does not answer (another).
func (c *Content) Reader(ctx context.Context, d digest.Digest) (io.ReadSeekCloser, int64, error) {
	ctx = c.ctx(ctx)
	info, err := c.store.Info(ctx, d)
	if err != nil {
		return nil, 0, err
	}
	ra, err := c.store.ReaderAt(ctx, ocispec.Descriptor{Digest: d, Size: info.Size})
	if err != nil {
		return nil, 0, err
	}
	return &sectionCloser{SectionReader: io.NewSectionReader(ra, 0, info.Size), c: ra}, info.Size, nil
}

// Has says whether containerd's content store holds d; an error when containerd does
// not tell (it does not answer), as opposed to a definite "not held".
func (c *Content) Has(ctx context.Context, d digest.Digest) (bool, error) {
	_, err := c.store.Info(c.ctx(ctx), d)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

type sectionCloser struct {
	*io.SectionReader
	c io.Closer
}

func (s *sectionCloser) Close() error { return s.c.Close() }
