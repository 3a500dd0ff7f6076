package env

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/crypto/bcrypt"
)

// Registry is a docker-registry process on 127.0.0.1.
type Registry struct {
	Host string // 127.0.0.1:PORT
	cmd  *exec.Cmd
	Dir  string
	// User and Password, when set, are required by the registry (htpasswd) for every
	// request; the test's pushes send them.
	User, Password string
}

// StartRegistry runs Debian's docker-registry with filesystem storage under dir.
func StartRegistry(dir string) (*Registry, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	return startRegistry(dir, fmt.Sprintf("127.0.0.1:%d", port), false)
}

// StartAuthRegistry is StartRegistry requiring user and password (htpasswd, bcrypt) for
// every request, pulls included, as a private registry does.
func StartAuthRegistry(dir, user, password string) (*Registry, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		return nil, err
	}
	r := &Registry{Host: fmt.Sprintf("127.0.0.1:%d", port), Dir: dir, User: user, Password: password}
	return r, r.Restart()
}

// Restart starts a stopped registry again, on the same address and storage.
func (r *Registry) Restart() error {
	n, err := startRegistry(r.Dir, r.Host, r.User != "")
	if err != nil {
		return err
	}
	r.cmd = n.cmd
	return nil
}

// Auth is the registry's credential as a pull secret's auth (base64 of user:password).
func (r *Registry) Auth() string {
	return base64.StdEncoding.EncodeToString([]byte(r.User + ":" + r.Password))
}

func startRegistry(dir, host string, auth bool) (*Registry, error) {
	cfg := fmt.Sprintf(`version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: %s}
  delete: {enabled: true}
http: {addr: %s}
`, filepath.Join(dir, "data"), host)
	if auth {
		cfg += fmt.Sprintf("auth:\n  htpasswd: {realm: imagepin-e2e, path: %s}\n", filepath.Join(dir, "htpasswd"))
	}
	cfgPath := filepath.Join(dir, "registry.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "registry.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("docker-registry", "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start docker-registry (run hack/e2e-deps.sh): %w", err)
	}
	r := &Registry{Host: host, cmd: cmd, Dir: dir}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			return r, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Stop()
	return nil, fmt.Errorf("docker-registry did not answer on %s", host)
}

// Stop kills the registry.
func (r *Registry) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

// Image is a pushed image.
type Image struct {
	Repo   string // 127.0.0.1:PORT/name
	Digest string
	Size   int64 // compressed layer bytes
}

// Ref is the digest reference to pin and pull.
func (i Image) Ref() string { return i.Repo + "@" + i.Digest }

// PushRandom pushes an image of `layers` random layers of layerSize bytes (distinct
// content, so each image has its own ID: CRI-O pins per image ID), on top of base
// layers when given (shared layers).
func (r *Registry) PushRandom(ctx context.Context, repo string, layers int, layerSize int64, base ...v1.Layer) (Image, error) {
	img := empty.Image
	var err error
	if len(base) > 0 {
		if img, err = mutate.AppendLayers(img, base...); err != nil {
			return Image{}, err
		}
	}
	for i := 0; i < layers; i++ {
		l, err := random.Layer(layerSize, "application/vnd.docker.image.rootfs.diff.tar.gzip")
		if err != nil {
			return Image{}, err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return Image{}, err
		}
	}
	return r.write(ctx, repo, img)
}

// write gives img a unique config (two images with the same layers still differ: CRI-O
// pins per image ID) and pushes it.
func (r *Registry) write(ctx context.Context, repo string, img v1.Image) (Image, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Config.Labels = map[string]string{"imagepin.test/nonce": fmt.Sprintf("%x", nonce)}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return Image{}, err
	}
	ref, err := name.ParseReference(r.Host+"/"+repo+":latest", name.Insecure)
	if err != nil {
		return Image{}, err
	}
	opts := []remote.Option{remote.WithContext(ctx)}
	if r.User != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}))
	}
	if err := remote.Write(ref, img, opts...); err != nil {
		return Image{}, fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return Image{}, err
	}
	ls, _ := img.Layers()
	var size int64
	for _, l := range ls {
		s, _ := l.Size()
		size += s
	}
	return Image{Repo: r.Host + "/" + repo, Digest: d.String(), Size: size}, nil
}

// RandomLayer makes a layer to share between images.
func RandomLayer(size int64) (v1.Layer, error) {
	return random.Layer(size, "application/vnd.docker.image.rootfs.diff.tar.gzip")
}

// PushCompressible pushes an image of `layers` layers, each a tar holding size bytes of
// word-like text, so that gzip shrinks it about as much as real image content.
func (r *Registry) PushCompressible(ctx context.Context, repo string, layers int, size int64) (Image, error) {
	return r.PushContent(ctx, repo, layers, size, TextContent)
}

// Layer contents that compress like real ones.
const (
	// TextContent is word-like text (gzip about 3:1 to 4:1).
	TextContent = "text"
	// BinaryContent is half random bytes, half structure, like executables (gzip about 2:1).
	BinaryContent = "binary"
)

// PushContent pushes an image of `layers` gzip layers, each a tar of size bytes of kind.
func (r *Registry) PushContent(ctx context.Context, repo string, layers int, size int64, kind string) (Image, error) {
	img := empty.Image
	words := []string{"lib", "usr", "bin", "share", "config", "openshift", "kube", "container", "runtime", "image",
		"node", "etcd", "api", "server", "controller", "manager", "proxy", "network", "storage", "operator"}
	for i := 0; i < layers; i++ {
		var text bytes.Buffer
		var seed [8]byte
		rand.Read(seed[:])
		x := binary.LittleEndian.Uint64(seed[:]) | 1
		for int64(text.Len()) < size {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			if kind == BinaryContent {
				// 8 random bytes, then 8 of a few opcodes-like patterns.
				binary.Write(&text, binary.LittleEndian, x)
				text.Write([]byte{0x48, 0x89, 0xe5, 0x41, 0x57, byte(x >> 61), 0x00, 0x00})
				continue
			}
			text.WriteString(words[x%uint64(len(words))])
			text.WriteByte(" /.\n_-"[x>>60%6])
			if x%97 == 0 {
				fmt.Fprintf(&text, "%x", x)
			}
		}
		var tarBuf bytes.Buffer
		tw := tar.NewWriter(&tarBuf)
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("data-%d.bin", i), Mode: 0o644, Size: int64(text.Len())})
		tw.Write(text.Bytes())
		tw.Close()
		data := tarBuf.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			return Image{}, err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return Image{}, err
		}
	}
	return r.write(ctx, repo, img)
}

// PushRunnable pushes an image whose entrypoint is binary (a static executable, copied
// in as /app): an image a pod can run.
func (r *Registry) PushRunnable(ctx context.Context, repo, binary string) (Image, error) {
	return r.PushRunnableWith(ctx, repo, binary)
}

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
	// LayerFromOpener, not LayerFromReader: the latter copies the reader into a temporary
	// file that it never removes (one per push, left in /tmp).
	layerData := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerData)), nil })
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
