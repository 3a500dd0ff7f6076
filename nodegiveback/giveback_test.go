package nodegiveback

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/original"
)

// node is a node's runtime files under a temp root, written by the real writers with
// the original records on, and the Deps imagepind uninstall gives for it.
type node struct {
	root, state, hostsDir string
	hosts                 *containerd.MirrorHosts
	dropIn                crio.DropIn
	reloads, unpins       int
	reloadErr             error
}

func newNode(t *testing.T) *node {
	root := t.TempDir()
	n := &node{root: root, state: filepath.Join(root, "var/lib/imagepin"), hostsDir: filepath.Join(root, "etc/containerd/certs.d")}
	os.MkdirAll(n.state, 0o700) // as state.Open makes it
	book := original.New(n.state)
	n.hosts = &containerd.MirrorHosts{Local: "127.0.0.1:7443", ConfigPath: n.hostsDir, Record: filepath.Join(n.state, "hosts.json"),
		Path: func(repo string) string { return "mirror/" + repo }, Originals: book}
	n.dropIn = crio.DropIn{MainConfig: filepath.Join(root, "etc/crio/crio.conf"), ConfigDir: filepath.Join(root, "etc/crio/crio.conf.d"), Originals: book}
	return n
}

func (n *node) deps() Deps {
	book := original.New(n.state)
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	return Deps{
		Log:       quiet,
		Originals: book,
		Rest: func(path string, text []byte) []byte {
			if filepath.Base(path) == "hosts.toml" {
				return containerd.WithoutMirror(text)
			}
			return nil
		},
		// As wire's: what each writer knows of its own files.
		Sweep: func() ([]string, error) {
			sweep := &containerd.MirrorHosts{Record: n.hosts.Record, ConfigPath: n.hostsDir}
			if err := sweep.SyncHosts(nil); err != nil {
				return nil, err
			}
			_, err := crio.DropIn{MainConfig: n.dropIn.MainConfig, ConfigDir: n.dropIn.ConfigDir}.Apply(nil)
			return nil, err
		},
		Unpin:  func(context.Context) ([]string, error) { n.unpins++; return []string{"a"}, nil },
		Reload: func(context.Context) error { n.reloads++; return n.reloadErr },
	}
}

func (n *node) config() Config {
	return Config{StateDir: n.state, StoreDir: filepath.Join(n.state, "blobs"), Keep: []string{"lock"}}
}

// An administrator's hosts.toml imagepind put its block in comes back byte for byte,
// with its mode and owner (here: no newline at its end, which the block's insertion
// adds and taking the block out keeps); a hosts.toml imagepind made goes with its
// directory; the pin drop-in and crio.conf.d it made go.
func TestGiveBackByteIdentical(t *testing.T) {
	n := newNode(t)
	adminFile := filepath.Join(n.hostsDir, "registry.example", "hosts.toml")
	adminText := "# the administrator's\nserver = \"https://registry.example\""
	os.MkdirAll(filepath.Dir(adminFile), 0o755)
	if err := os.WriteFile(adminFile, []byte(adminText), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chmod(adminFile, 0o640)
	if err := n.hosts.SyncHosts([]string{"registry.example", "quay.example"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.dropIn.Apply([]string{"registry.example/app@sha256:" + strings.Repeat("a", 64)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(adminFile); string(got) == adminText {
		t.Fatal("the block was not written: the test proves nothing")
	}
	os.MkdirAll(filepath.Join(n.state, "blobs"), 0o700)

	r, err := Run(context.Background(), n.config(), n.deps())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(adminFile)
	if string(got) != adminText {
		t.Errorf("the administrator's hosts.toml:\n%q\nwant its original bytes:\n%q", got, adminText)
	}
	if fi, _ := os.Stat(adminFile); fi.Mode().Perm() != 0o640 {
		t.Errorf("the administrator's hosts.toml has mode %v, want 0640", fi.Mode().Perm())
	}
	for _, gone := range []string{filepath.Join(n.hostsDir, "quay.example"), n.dropIn.ConfigDir, filepath.Join(n.state, "blobs"), filepath.Join(n.state, "originals")} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", gone, err)
		}
	}
	if !r.Reloaded || n.reloads != 1 || n.unpins != 1 {
		t.Errorf("reloaded %v (%d reloads), %d unpins: want once each", r.Reloaded, n.reloads, n.unpins)
	}
	back, err := ReadReceipt(n.state)
	if err != nil || len(back.Files) != 3 {
		t.Fatalf("receipt %+v, %v: want the three files", back, err)
	}
	// Again: given back, nothing done.
	if _, err := Run(context.Background(), n.config(), n.deps()); err != nil || n.reloads != 1 || n.unpins != 1 {
		t.Errorf("second run: %v, %d reloads, %d unpins; want nothing done", err, n.reloads, n.unpins)
	}
}

// An administrator's edit after imagepind wrote its block is kept, without the block.
func TestGiveBackKeepsLaterEdit(t *testing.T) {
	n := newNode(t)
	file := filepath.Join(n.hostsDir, "registry.example", "hosts.toml")
	os.MkdirAll(filepath.Dir(file), 0o755)
	os.WriteFile(file, []byte("server = \"https://registry.example\"\n"), 0o644)
	if err := n.hosts.SyncHosts([]string{"registry.example"}); err != nil {
		t.Fatal(err)
	}
	withBlock, _ := os.ReadFile(file)
	os.WriteFile(file, append(withBlock, "# the administrator's later line\n"...), 0o644)
	if _, err := Run(context.Background(), n.config(), n.deps()); err != nil {
		t.Fatal(err)
	}
	want := "server = \"https://registry.example\"\n# the administrator's later line\n"
	if got, _ := os.ReadFile(file); string(got) != want {
		t.Errorf("hosts.toml %q, want the administrator's later edit without the block %q", got, want)
	}
}

// A run stopped part way (the reload failing) leaves no receipt, and the next run
// finishes: the files given back, one reload of its own, the receipt.
func TestGiveBackResumes(t *testing.T) {
	n := newNode(t)
	if _, err := n.dropIn.Apply([]string{"registry.example/app@sha256:" + strings.Repeat("a", 64)}); err != nil {
		t.Fatal(err)
	}
	n.reloadErr = errors.New("crio not answering")
	if _, err := Run(context.Background(), n.config(), n.deps()); err == nil {
		t.Fatal("a failed reload: no error")
	}
	if _, err := ReadReceipt(n.state); !errors.Is(err, ErrNotGivenBack) {
		t.Fatalf("receipt after a failed run: %v", err)
	}
	n.reloadErr = nil
	if _, err := Run(context.Background(), n.config(), n.deps()); err != nil {
		t.Fatal(err)
	}
	if n.reloads != 2 {
		t.Errorf("%d reload calls, want the failed one and one more", n.reloads)
	}
	if _, err := os.Stat(n.dropIn.Path()); !os.IsNotExist(err) {
		t.Errorf("the drop-in is still there: %v", err)
	}
	if _, err := ReadReceipt(n.state); err != nil {
		t.Errorf("no receipt after the second run: %v", err)
	}
	entries, _ := os.ReadDir(n.state)
	for _, e := range entries {
		if e.Name() != ReceiptFile && e.Name() != "lock" {
			t.Errorf("state left: %s", e.Name())
		}
	}
}
