package containerd

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"google.golang.org/grpc"

	"github.com/imagepin/imagepin/cri"
)

// hungImages is containerd's image service accepting every call and never answering.
type hungImages struct {
	imagesapi.UnimplementedImagesServer
	calls chan string
}

func (h *hungImages) Get(ctx context.Context, r *imagesapi.GetImageRequest) (*imagesapi.GetImageResponse, error) {
	h.calls <- r.GetName()
	<-ctx.Done()
	return nil, ctx.Err()
}

// A containerd that hangs costs the pinner one call's deadline, then it stops asking:
// before the fix the calls had no deadline, and the reconcile loop (and with it the
// heartbeat and systemd's watchdog) stopped for good.
func TestHungContainerdCostsOneDeadline(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hung := &hungImages{calls: make(chan string, 100)}
	imagesapi.RegisterImagesServer(srv, hung)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)

	images, err := DialImages(sock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer images.Close()
	images.callTimeout = 200 * time.Millisecond
	p := &Pinner{Images: images, Record: filepath.Join(t.TempDir(), "labels.json")}
	refs := []string{
		"registry.example/a@sha256:" + digestHex(1), "registry.example/b@sha256:" + digestHex(2),
		"registry.example/c@sha256:" + digestHex(3),
	}
	start := time.Now()
	_, err = p.Write(context.Background(), refs, func(string) (bool, bool) { return true, false })
	took := time.Since(start)
	if err == nil || !errors.Is(err, cri.ErrUnavailable) {
		t.Fatalf("a hung containerd: %v", err)
	}
	if took > 5*time.Second {
		t.Fatalf("the write took %s", took)
	}
	if n := len(hung.calls); n != 1 {
		t.Fatalf("%d calls to a containerd that does not answer, want 1", n)
	}
}

func digestHex(n int) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 64)
	for i := range b {
		b[i] = '0'
	}
	b[63] = hex[n%16]
	return string(b)
}
