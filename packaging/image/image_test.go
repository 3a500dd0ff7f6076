package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var (
	testArches   = []string{"amd64", "arm64", "ppc64le", "s390x"}
	testBinaries = []string{"imagepind", "imagepinctl", "imagepin-aggregator"}
)

// fakeELF is a 64-bit ELF header for arch followed by payload; interp adds a PT_INTERP
// program header (a dynamically linked binary).
func fakeELF(t *testing.T, arch string, payload string, interp bool) []byte {
	t.Helper()
	m := machines[arch]
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(m.machine), Version: uint32(elf.EV_CURRENT), Ehsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	h.Ident[elf.EI_DATA] = byte(dataOf(m.order))
	h.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	var progs []elf.Prog64
	if interp {
		h.Phoff, h.Phentsize, h.Phnum = 64, 56, 1
		progs = append(progs, elf.Prog64{Type: uint32(elf.PT_INTERP), Off: 120, Filesz: 8, Memsz: 8})
	}
	var b bytes.Buffer
	if err := binary.Write(&b, m.order, h); err != nil {
		t.Fatal(err)
	}
	for _, p := range progs {
		if err := binary.Write(&b, m.order, p); err != nil {
			t.Fatal(err)
		}
	}
	b.WriteString(payload)
	return b.Bytes()
}

// fakeBins writes root/linux-<arch>/<binary> for every arch and binary and returns the
// Config over them.
func fakeBins(t *testing.T, root string) Config {
	t.Helper()
	cfg := Config{
		Binaries:   testBinaries,
		Entrypoint: []string{"/usr/bin/imagepind"},
		Created:    time.Unix(1767225600, 0),
		Labels:     map[string]string{"org.opencontainers.image.revision": "abc"},
	}
	for _, a := range testArches {
		dir := filepath.Join(root, "linux-"+a)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, b := range testBinaries {
			if err := os.WriteFile(filepath.Join(dir, b), fakeELF(t, a, b+" for "+a, false), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cfg.Platforms = append(cfg.Platforms, Platform{Arch: a, Dir: dir})
	}
	return cfg
}

func write(t *testing.T, dir string, cfg Config) v1.Hash {
	t.Helper()
	d, err := Write(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Two builds from the same binaries give one digest, though the second's files have other
// times, modes and paths; a change of one byte, or of the time, gives another.
func TestWriteReproducible(t *testing.T) {
	tmp := t.TempDir()
	cfg := fakeBins(t, filepath.Join(tmp, "a"))
	first := write(t, filepath.Join(tmp, "out1"), cfg)

	// The same binaries elsewhere, with other times and modes.
	other := fakeBins(t, filepath.Join(tmp, "b", "deeper"))
	later := time.Now().Add(time.Hour)
	for _, p := range other.Platforms {
		for _, b := range other.Binaries {
			f := filepath.Join(p.Dir, b)
			if err := os.Chmod(f, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(f, later, later); err != nil {
				t.Fatal(err)
			}
		}
	}
	second := write(t, filepath.Join(tmp, "out2"), other)
	if first != second {
		t.Fatalf("two builds from the same binaries: %s then %s", first, second)
	}
	for _, f := range []string{"index.json", "oci-layout"} {
		a, _ := os.ReadFile(filepath.Join(tmp, "out1", f))
		b, _ := os.ReadFile(filepath.Join(tmp, "out2", f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between the builds:\n%s\n%s", f, a, b)
		}
	}
	// Written over the first: same digest, nothing left beside it.
	if again := write(t, filepath.Join(tmp, "out1"), cfg); again != first {
		t.Fatalf("rewritten: %s, first %s", again, first)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, ".out1.tmp-*")); len(left) != 0 {
		t.Fatalf("work directories left: %v", left)
	}

	// Content and time are in the digest.
	changed := filepath.Join(other.Platforms[3].Dir, "imagepinctl")
	if err := os.WriteFile(changed, fakeELF(t, "s390x", "imagepinctl for s390X", false), 0o755); err != nil {
		t.Fatal(err)
	}
	if d := write(t, filepath.Join(tmp, "out3"), other); d == first {
		t.Fatalf("a changed binary kept the digest %s", d)
	}
	cfg.Created = cfg.Created.Add(time.Second)
	if d := write(t, filepath.Join(tmp, "out4"), cfg); d == first {
		t.Fatalf("another time kept the digest %s", d)
	}
}

// What the layout holds, read back: the index's platforms, the configs, and the layer's
// entries with their owners, modes and times.
func TestWriteContents(t *testing.T) {
	tmp := t.TempDir()
	cfg := fakeBins(t, tmp)
	out := filepath.Join(tmp, "out")
	d := write(t, out, cfg)

	sizes, err := Verify(out, testArches, testBinaries)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range sizes {
		if s.Arch != testArches[i] || s.Compressed <= 0 || s.Uncompressed <= 0 {
			t.Errorf("sizes[%d] = %+v", i, s)
		}
	}

	idx, err := Index(out)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := idx.Digest(); got != d {
		t.Fatalf("layout's index %s, Write said %s", got, d)
	}
	im, _ := idx.IndexManifest()
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s", im.MediaType)
	}
	for i, desc := range im.Manifests {
		if desc.ArtifactType != "" || desc.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %d: artifactType %q media type %s, want an image manifest", i, desc.ArtifactType, desc.MediaType)
		}
		if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != testArches[i] {
			t.Fatalf("manifest %d platform %v, want linux/%s", i, desc.Platform, testArches[i])
		}
		img, _ := idx.Image(desc.Digest)
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !cf.Created.Equal(cfg.Created) || cf.Architecture != testArches[i] || cf.Config.Entrypoint[0] != "/usr/bin/imagepind" ||
			cf.Config.Labels["org.opencontainers.image.revision"] != "abc" || cf.Config.User != "" {
			t.Errorf("linux/%s config: created %s arch %s entrypoint %q labels %v user %q", testArches[i], cf.Created, cf.Architecture, cf.Config.Entrypoint, cf.Config.Labels, cf.Config.User)
		}
		layers, _ := img.Layers()
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			wantMode := int64(0o755)
			if h.Name == "tmp/" {
				wantMode = 0o1777
			}
			if h.Uid != 0 || h.Gid != 0 || h.Mode != wantMode || !h.ModTime.Equal(cfg.Created) {
				t.Errorf("linux/%s %s: owner %d:%d mode %#o time %s", testArches[i], h.Name, h.Uid, h.Gid, h.Mode, h.ModTime)
			}
			if h.Typeflag == tar.TypeReg {
				data, _ := io.ReadAll(tr)
				if want := fakeELF(t, testArches[i], filepath.Base(h.Name)+" for "+testArches[i], false); !bytes.Equal(data, want) {
					t.Errorf("linux/%s %s: not the binary given", testArches[i], h.Name)
				}
			}
		}
		rc.Close()
		want := "tmp/ usr/ usr/bin/ usr/bin/imagepin-aggregator usr/bin/imagepinctl usr/bin/imagepind"
		if got := strings.Join(names, " "); got != want {
			t.Errorf("linux/%s entries %q, want %q", testArches[i], got, want)
		}
	}
}

// A binary of another architecture, a dynamic one, one that cannot be run, or one missing
// is refused by Write, naming the file.
func TestWriteRefusesWrongBinary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		data  []byte
		perm  os.FileMode
		wants string
	}{
		{"other arch", fakeELF(t, "amd64", "x", false), 0o755, "ELF for ELFCLASS64 EM_X86_64 ELFDATA2LSB, linux/arm64 needs ELFCLASS64 EM_AARCH64 ELFDATA2LSB"},
		{"dynamic", fakeELF(t, "arm64", "x", true), 0o755, "dynamically linked"},
		{"not ELF", []byte("#!/bin/sh\n"), 0o755, "not an ELF file"},
		{"not executable", fakeELF(t, "arm64", "x", false), 0o644, "not executable"},
		{"missing", nil, 0, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			cfg := fakeBins(t, tmp)
			f := filepath.Join(cfg.Platforms[1].Dir, "imagepinctl")
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
			if tc.data != nil {
				if err := os.WriteFile(f, tc.data, tc.perm); err != nil {
					t.Fatal(err)
				}
			}
			out := filepath.Join(tmp, "out")
			_, err := Write(out, cfg)
			if err == nil || !strings.Contains(err.Error(), tc.wants) || !strings.Contains(err.Error(), "linux/arm64") {
				t.Fatalf("Write: %v, want an error with linux/arm64 and %q", err, tc.wants)
			}
			if !strings.Contains(err.Error(), f) && tc.name != "missing" {
				t.Fatalf("Write: %v does not name %s", err, f)
			}
			if _, serr := os.Stat(out); !os.IsNotExist(serr) {
				t.Fatalf("a failed Write left %s: %v", out, serr)
			}
		})
	}
}

// craftEntry is a tar entry of a hand-made layer.
type craftEntry struct {
	name     string
	mode     int64
	uid, gid int
	data     []byte
}

func goodEntries(t *testing.T, arch string) []craftEntry {
	var es []craftEntry
	for _, b := range testBinaries {
		es = append(es, craftEntry{name: "usr/bin/" + b, mode: 0o755, data: fakeELF(t, arch, b, false)})
	}
	return es
}

type craftPlatform struct {
	indexArch, configArch string
	entries               []craftEntry
	entrypoint            string
	artifact              bool // the index gives the image an artifactType
}

// craft writes a layout the way Write does not, to see Verify refuse it.
func craft(t *testing.T, dir string, ps []craftPlatform) {
	t.Helper()
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range ps {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range p.entries {
			if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, Size: int64(len(e.data)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(e.data); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		data := b.Bytes()
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			t.Fatal(err)
		}
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", p.configArch
		cf.Config.Entrypoint = []string{p.entrypoint}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		var add mutate.Appendable = plainImage{img}
		if p.artifact {
			add = img
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: add, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: p.indexArch}}})
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyRefuses(t *testing.T) {
	good := func(arch string) craftPlatform {
		return craftPlatform{indexArch: arch, configArch: arch, entries: goodEntries(t, arch), entrypoint: "/usr/bin/imagepind"}
	}
	for _, tc := range []struct {
		name  string
		edit  func(p *craftPlatform)
		wants string
	}{
		{"good", func(p *craftPlatform) {}, ""},
		{"index platform", func(p *craftPlatform) { p.indexArch = "amd64" }, "index platform linux/amd64, want linux/arm64"},
		{"artifact", func(p *craftPlatform) { p.artifact = true }, `artifactType "application/vnd.oci.image.config.v1+json"`},
		{"config platform", func(p *craftPlatform) { p.configArch = "amd64" }, "config platform linux/amd64, want linux/arm64"},
		{"binary of another arch", func(p *craftPlatform) { p.entries[1].data = fakeELF(t, "amd64", "x", false) }, "usr/bin/imagepinctl: ELF for ELFCLASS64 EM_X86_64"},
		{"dynamic", func(p *craftPlatform) { p.entries[0].data = fakeELF(t, "arm64", "x", true) }, "usr/bin/imagepind: dynamically linked"},
		{"owner", func(p *craftPlatform) { p.entries[2].uid = 1000 }, "usr/bin/imagepin-aggregator: owner 1000:0, want 0:0"},
		{"group", func(p *craftPlatform) { p.entries[2].gid = 5 }, "owner 0:5"},
		{"not executable", func(p *craftPlatform) { p.entries[0].mode = 0o744 }, "usr/bin/imagepind: mode 0744, not executable by all"},
		{"missing", func(p *craftPlatform) { p.entries = p.entries[:2] }, "/usr/bin/imagepin-aggregator missing"},
		{"entrypoint", func(p *craftPlatform) { p.entrypoint = "/bin/sh" }, `entrypoint ["/bin/sh"] is none of the binaries`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := []craftPlatform{good("amd64"), good("arm64"), good("ppc64le"), good("s390x")}
			tc.edit(&ps[1])
			dir := filepath.Join(t.TempDir(), "layout")
			craft(t, dir, ps)
			_, err := Verify(dir, testArches, testBinaries)
			if tc.wants == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wants) || !strings.Contains(err.Error(), "want linux/arm64") {
				t.Fatalf("Verify: %v, want an error about manifest 1 (linux/arm64) with %q", err, tc.wants)
			}
		})
	}
}

// A layer blob changed on disk after the build is caught by its digest; a layout with
// fewer platforms than asked for is refused.
func TestVerifyRefusesChangedLayout(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	write(t, out, fakeBins(t, tmp))
	if _, err := Verify(out, testArches[:3], testBinaries); err == nil || !strings.Contains(err.Error(), "index has 4 manifests, want 3") {
		t.Fatalf("Verify for 3 arches: %v", err)
	}
	idx, _ := Index(out)
	im, _ := idx.IndexManifest()
	img, _ := idx.Image(im.Manifests[2].Digest)
	m, _ := img.Manifest()
	blob := filepath.Join(out, "blobs", "sha256", m.Layers[0].Digest.Hex)
	data, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	// The gzip trailer's CRC and size are the last 8 bytes: change a byte before them
	// that gzip does not check, the header's OS byte.
	data[9] ^= 0xff
	if err := os.WriteFile(blob, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Verify(out, testArches, testBinaries)
	if err == nil || !strings.Contains(err.Error(), "compressed: content is sha256:") || !strings.Contains(err.Error(), "want linux/ppc64le") {
		t.Fatalf("Verify of a changed blob: %v", err)
	}
}

// Push sends the index to a registry, which then serves the same digest per platform.
func TestPush(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	d := write(t, out, fakeBins(t, tmp))
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	ref, err := Push(out, host+"/imagepin/imagepin:test")
	if err != nil {
		t.Fatal(err)
	}
	if ref.DigestStr() != d.String() {
		t.Fatalf("pushed %s, built %s", ref, d)
	}
	tag, _ := name.ParseReference(host + "/imagepin/imagepin:test")
	got, err := remote.Index(tag)
	if err != nil {
		t.Fatal(err)
	}
	if gd, _ := got.Digest(); gd != d {
		t.Fatalf("registry serves %s for the tag, pushed %s", gd, d)
	}
	for _, a := range testArches {
		img, err := remote.Image(tag, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: a}))
		if err != nil {
			t.Fatalf("linux/%s: %v", a, err)
		}
		cf, _ := img.ConfigFile()
		if cf.Architecture != a {
			t.Fatalf("linux/%s served a config for %s", a, cf.Architecture)
		}
	}
}
