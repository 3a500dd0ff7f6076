package containerd_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/registry"
	"github.com/imagepin/imagepin/test/registrytest"
)

func writeHosts(t *testing.T, root, dir, content string) {
	t.Helper()
	d := filepath.Join(root, dir)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func conf(t *testing.T, h *containerd.Hosts, image string) string {
	t.Helper()
	c, _, _ := h.Files(image)
	b, err := os.ReadFile(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The translation says what containerd does: hosts in file order as mirrors (pull-only
// ones for digests only), the server last; http or skip_verify insecure; a host's
// directory spelled host_port_ first; _default for a registry without its own;
// containerd's defaults without any (docker.io's real host, http for a loopback port).
func TestHostsTranslation(t *testing.T) {
	root := t.TempDir()
	writeHosts(t, root, "quay.io", `server = "https://quay.io"

[host."https://mirror-b.example:5000"]
  capabilities = ["pull", "resolve"]
  skip_verify = true

[host."http://mirror-a.example"]
  capabilities = ["pull"]

[host."https://push-only.example"]
  capabilities = ["push"]
`)
	writeHosts(t, root, "registry.local_5000_", `server = "http://registry.local:5000"`)
	writeHosts(t, root, "_default", `[host."https://fallback.example"]
  capabilities = ["pull", "resolve"]
`)
	h := &containerd.Hosts{ConfigPath: root, Dir: t.TempDir()}

	got := conf(t, h, "quay.io/app/x@sha256:"+strings.Repeat("1", 64))
	want := `[[registry]]
prefix = "quay.io"
location = "quay.io"
insecure = false
[[registry.mirror]]
location = "mirror-b.example:5000"
insecure = true
[[registry.mirror]]
location = "mirror-a.example"
insecure = true
pull-from-mirror = "digest-only"
`
	if !strings.Contains(got, want) {
		t.Fatalf("quay.io:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(got, "push-only") {
		t.Fatal("a host without pull is not a mirror")
	}
	for image, entry := range map[string]string{
		"registry.local:5000/a@sha256:" + strings.Repeat("2", 64): "prefix = \"registry.local:5000\"\nlocation = \"registry.local:5000\"\ninsecure = true\n",
		"ghcr.io/b@sha256:" + strings.Repeat("3", 64):             "prefix = \"ghcr.io\"\nlocation = \"ghcr.io\"\ninsecure = false\n[[registry.mirror]]\nlocation = \"fallback.example\"\n",
	} {
		if got := conf(t, h, image); !strings.Contains(got, entry) {
			t.Errorf("%s:\n%s\nwant:\n%s", image, got, entry)
		}
	}
	empty := &containerd.Hosts{ConfigPath: t.TempDir(), Dir: t.TempDir()}
	if got := conf(t, empty, "docker.io/library/busybox@sha256:"+strings.Repeat("4", 64)); !strings.Contains(got, "location = \"registry-1.docker.io\"\ninsecure = false") {
		t.Errorf("docker.io without hosts:\n%s", got)
	}
	if got := conf(t, empty, "127.0.0.1:5000/x@sha256:"+strings.Repeat("5", 64)); !strings.Contains(got, "location = \"127.0.0.1:5000\"\ninsecure = true") {
		t.Errorf("a loopback registry is plain HTTP to containerd:\n%s", got)
	}
	if p := h.Problems(); len(p) != 0 {
		t.Fatalf("problems: %v", p)
	}
}

// What the disk check cannot follow is said, per registry; a hosts.toml that does not
// parse falls back to the directory's certificate files, as in containerd.
func TestHostsProblems(t *testing.T) {
	root := t.TempDir()
	writeHosts(t, root, "quay.io", `[host."https://mirror.example/harbor"]
  override_path = true
  header = {X-Token = "t"}
`)
	writeHosts(t, root, "broken.example", `server = [`)
	h := &containerd.Hosts{ConfigPath: root, Dir: t.TempDir()}
	conf(t, h, "quay.io/x@sha256:"+strings.Repeat("1", 64))
	conf(t, h, "broken.example/x@sha256:"+strings.Repeat("1", 64))
	p := strings.Join(h.Problems(), "\n")
	for _, want := range []string{"override_path or a prefix", "sets header", "broken.example/hosts.toml does not parse"} {
		if !strings.Contains(p, want) {
			t.Errorf("problems lack %q:\n%s", want, p)
		}
	}
	// A change of the file is followed.
	writeHosts(t, root, "quay.io", `[host."https://mirror.example"]`)
	if got := conf(t, h, "quay.io/x@sha256:"+strings.Repeat("1", 64)); !strings.Contains(got, `location = "mirror.example"`) {
		t.Fatalf("after the edit:\n%s", got)
	}
	if strings.Contains(strings.Join(h.Problems(), "\n"), "override_path") {
		t.Fatal("an edited file's problem stays")
	}
}

// Through the real registry access: a disconnected containerd node whose source does
// not exist and whose pull-only mirror, over TLS, is trusted by the ca file hosts.toml
// names. The disk check sizes the image through it.
func TestHostsMirrorWithCAThroughTheResolver(t *testing.T) {
	reg := registrytest.New(t, nil)
	l, err := random.Layer(4000, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Push("ocp/release", img, "")
	digest := strings.SplitN(ref, "@", 2)[1]
	root := t.TempDir()
	cas := t.TempDir()
	reg.WriteCA(cas)
	writeHosts(t, root, "upstream.example.invalid", `server = "https://upstream.example.invalid"
[host."https://`+reg.Host+`"]
  capabilities = ["pull"]
  ca = "`+filepath.Join(cas, reg.Host, "ca.crt")+`"
`)
	h := &containerd.Hosts{ConfigPath: root, Dir: t.TempDir()}
	r := registry.New(registry.Config{
		Platform: registry.Platform{OS: "linux", Architecture: "amd64"}, Concurrency: 2, RegistryFiles: h.Files,
	}, nil)
	got, err := r.Resolve(context.Background(), "upstream.example.invalid/ocp/release@"+digest)
	if err != nil {
		t.Fatal(err)
	}
	size, _ := l.Size()
	if got.Bytes() != uint64(size) {
		t.Fatalf("sized %d, want %d", got.Bytes(), size)
	}
	// A tag is not asked of a pull-only mirror (containerd resolves tags only on hosts
	// with resolve).
	if _, err := r.Resolve(context.Background(), "upstream.example.invalid/ocp/release:latest"); err == nil || strings.Contains(err.Error(), reg.Host) {
		t.Fatalf("a tag went to a pull-only mirror: %v", err)
	}
}
