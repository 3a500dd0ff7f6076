package env

import (
	"archive/tar"
	"bytes"
	"context"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// PID is the registry process's (0 when stopped): what `make demo` stops it by.
func (r *Registry) PID() int {
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

// PushRunnableWith is PushRunnable with more layers after the executable's (random
// ones, say): two runnable images of the same binary that share no layer but that one.
func (r *Registry) PushRunnableWith(ctx context.Context, repo, binary string, extra ...v1.Layer) (Image, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return Image{}, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "app", Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return Image{}, err
	}
	if _, err := tw.Write(data); err != nil {
		return Image{}, err
	}
	if err := tw.Close(); err != nil {
		return Image{}, err
	}
	layer, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return Image{}, err
	}
	img, err := mutate.AppendLayers(empty.Image, append([]v1.Layer{layer}, extra...)...)
	if err != nil {
		return Image{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, err
	}
	cf = cf.DeepCopy()
	cf.Config.Entrypoint = []string{"/app"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Image{}, err
	}
	return r.write(ctx, repo, img)
}
