package registrytest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// RandomLayer is a layer of random bytes (incompressible) of about size bytes.
func RandomLayer(t *testing.T, size int64) v1.Layer {
	t.Helper()
	l, err := random.Layer(size, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is an image of the layers.
func Image(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// LayerBytes is the layers' compressed size.
func LayerBytes(t *testing.T, ls ...v1.Layer) uint64 {
	var n uint64
	for _, l := range ls {
		s, err := l.Size()
		if err != nil {
			t.Fatal(err)
		}
		n += uint64(s)
	}
	return n
}

// Files are a node's registry configuration files, in a test's directory.
type Files struct {
	Dir, Conf, ConfDir, Certs string
}

// NewFiles writes registries.conf (and empty registries.conf.d and certs.d).
func NewFiles(t *testing.T, registriesConf string) Files {
	dir := t.TempDir()
	f := Files{Dir: dir, Conf: filepath.Join(dir, "registries.conf"), ConfDir: filepath.Join(dir, "registries.conf.d"), Certs: filepath.Join(dir, "certs.d")}
	os.MkdirAll(f.ConfDir, 0o755)
	os.MkdirAll(f.Certs, 0o755)
	if err := os.WriteFile(f.Conf, []byte(registriesConf), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// ForgedZstdImage is an OCI image of two zstd layers (about 2 MiB each) whose frame
// headers claim 2^62 bytes of content: what a hostile or broken registry could serve.
func ForgedZstdImage(t *testing.T) v1.Image {
	t.Helper()
	// A zstd frame header: single segment, 8-byte content size 2^62, then junk.
	forged := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0, 0, 0, 0, 0x40}
	forged = append(forged, bytes.Repeat([]byte{0x55}, 2<<20)...)
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, static.NewLayer(forged, types.OCILayerZStd), static.NewLayer(append([]byte{1}, forged...), types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	return img
}
