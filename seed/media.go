package seed

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// ErrBadMedia is wrapped by every error that is the medium's fault (not the node's):
// a damaged tar, a hostile path or link, a wrong digest, a missing blob.
var ErrBadMedia = errors.New("bad media")

func badf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadMedia, fmt.Sprintf(format, args...))
}

// media is a medium's files by their slash-separated path inside it: a directory's, or
// the regular files of one or more tars (read in place, by offset: never extracted).
type media struct {
	path string
	// kind is "directory", "tar" or "tars" (a directory of oc-mirror's mirror_NNNNNN.tar).
	kind    string
	tars    []*os.File
	entries map[string]entry
	// refused is the first entry of a tar refused (a link, a path out of the medium, a
	// device): the medium is refused, after its format is known (a docker-archive,
	// which skopeo writes with symlinks, is refused for what it is).
	refused error
}

// entry is a regular file of a medium.
type entry struct {
	size int64
	// file is the file on disk (a directory's), or tar is the index in media.tars and
	// off where its data starts.
	file string
	tar  int
	off  int64
}

func (m *media) Close() {
	for _, f := range m.tars {
		f.Close()
	}
}

// has says whether the medium has the file name.
func (m *media) has(name string) bool { _, ok := m.entries[name]; return ok }

// hasDir says whether the medium has a file under dir (with its trailing slash).
func (m *media) hasDir(dir string) bool {
	for name := range m.entries {
		if strings.HasPrefix(name, dir) {
			return true
		}
	}
	return false
}

// under lists the files under dir, sorted.
func (m *media) under(dir string) []string {
	var out []string
	for name := range m.entries {
		if strings.HasPrefix(name, dir) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// open reads the file name: the reader is bounded to its size, and seeks.
func (m *media) open(name string) (io.ReadSeekCloser, int64, error) {
	e, ok := m.entries[name]
	if !ok {
		return nil, 0, fs.ErrNotExist
	}
	if e.file == "" {
		return nopCloser{io.NewSectionReader(m.tars[e.tar], e.off, e.size)}, e.size, nil
	}
	f, err := os.OpenFile(e.file, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", name, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != e.size {
		f.Close()
		return nil, 0, fmt.Errorf("%s: changed while seeding", name)
	}
	return &sectionFile{SectionReader: io.NewSectionReader(f, 0, e.size), f: f}, e.size, nil
}

type nopCloser struct{ *io.SectionReader }

func (nopCloser) Close() error { return nil }

type sectionFile struct {
	*io.SectionReader
	f *os.File
}

func (s *sectionFile) Close() error { return s.f.Close() }

// readSmall reads a whole small file (index.json, a link), at most max bytes.
func (m *media) readSmall(name string, max int64) ([]byte, error) {
	rd, size, err := m.open(name)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	if size > max {
		return nil, badf("%s: %d bytes, more than the %d a file of its kind may have", name, size, max)
	}
	return io.ReadAll(rd)
}

// ociMarkers and distPrefixes say what a directory holds before it is walked: only
// the part of it a format reads is walked.
const (
	ociLayoutFile = "oci-layout"
	ociIndexFile  = "index.json"
	distRoot      = "docker/registry/v2/"
)

// openMedia opens the medium at p: a tar (the whole tar is indexed first, so a damaged
// or hostile one is refused before anything is read from it), a directory holding an
// image layout or a registry's storage, or a directory of oc-mirror's archives (one
// medium across its mirror_NNNNNN.tar files).
func openMedia(p string) (*media, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	m := &media{path: p, entries: map[string]entry{}}
	if fi.Mode().IsRegular() {
		m.kind = "tar"
		if err := m.addTar(p); err != nil {
			m.Close()
			return nil, err
		}
		return m, nil
	}
	if !fi.IsDir() {
		return nil, badf("%s: neither a directory nor a tar file", p)
	}
	root, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, err
	}
	exists := func(name string) bool { _, err := os.Lstat(filepath.Join(root, name)); return err == nil }
	switch {
	case exists(ociLayoutFile) || exists(ociIndexFile):
		m.kind = "directory"
		for _, f := range []string{ociLayoutFile, ociIndexFile} {
			if err := m.addDirFile(root, f); err != nil {
				return nil, err
			}
		}
		if exists("blobs") {
			err = m.walkDir(root, "blobs")
		}
	case exists(strings.TrimSuffix(distRoot, "/")):
		m.kind = "directory"
		err = m.walkDir(root, strings.TrimSuffix(distRoot, "/"))
	case exists("repositories") && exists("blobs"): // the v2 directory itself
		m.kind = "directory"
		err = m.walkDir(root, ".")
	case exists("manifest.json"):
		m.kind = "directory"
		err = m.addDirFile(root, "manifest.json")
	default:
		tars, _ := filepath.Glob(filepath.Join(root, "mirror_*.tar"))
		if len(tars) == 0 {
			return nil, badf("%s: no oci-layout, no docker/registry/v2 and no oc-mirror archive (mirror_*.tar): not a medium to seed from", p)
		}
		sort.Strings(tars)
		m.kind = "tars"
		for _, t := range tars {
			if t, err = archiveIn(root, t); err != nil {
				break
			}
			if err = m.addTar(t); err != nil {
				break
			}
		}
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// addDirFile adds one file of a directory medium, when present.
func (m *media) addDirFile(root, name string) error {
	full := filepath.Join(root, name)
	fi, err := os.Lstat(full)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return m.addDirEntry(root, name, full, fi)
}

// walkDir adds every regular file under root/sub. A symlink is followed only to a
// regular file inside root; one leading out of root, or to a directory, makes the whole
// medium refused.
func (m *media) walkDir(root, sub string) error {
	return filepath.WalkDir(filepath.Join(root, sub), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return m.addDirEntry(root, filepath.ToSlash(rel), p, fi)
	})
}

func (m *media) addDirEntry(root, name, full string, fi fs.FileInfo) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, tfi, err := linkIn(root, name, full)
		if err != nil {
			return err
		}
		m.entries[name] = entry{size: tfi.Size(), file: target}
	case fi.Mode().IsRegular():
		m.entries[name] = entry{size: fi.Size(), file: full}
	}
	// FIFOs, devices, sockets: never opened, so a file a format needs there is missing.
	return nil
}

// linkIn is where the symlink full (name in the medium at root) leads: a regular file
// inside root, or the medium is refused.
func linkIn(root, name, full string) (string, fs.FileInfo, error) {
	target, err := filepath.EvalSymlinks(full)
	if err != nil {
		return "", nil, badf("%s: a symlink that leads nowhere: %v", name, err)
	}
	if rel, err := filepath.Rel(root, target); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", nil, badf("%s: a symlink leading out of %s (to %s)", name, root, target)
	}
	tfi, err := os.Stat(target)
	if err != nil {
		return "", nil, err
	}
	if !tfi.Mode().IsRegular() {
		return "", nil, badf("%s: a symlink to something not a regular file (%s)", name, target)
	}
	return target, tfi, nil
}

// archiveIn is the oc-mirror archive p of the directory medium root, as the files of
// the other formats are taken: a regular file, or a symlink to one inside root.
// Anything else (a FIFO, a device, a link out of the medium) refuses the medium.
func archiveIn(root, p string) (string, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return "", err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _, err := linkIn(root, filepath.Base(p), p)
		return target, err
	}
	return p, nil
}

// addTar indexes the regular files of the tar p: where each one's data starts. Links,
// paths with "..", absolute paths, devices, sparse files, duplicates and a tar cut
// short are refused, naming the entry.
func (m *media) addTar(p string) error {
	// Opened as every file of a medium is: a FIFO named like a tar must not hang the seed.
	f, fi, err := fsutil.OpenRegular(p)
	if errors.Is(err, fsutil.ErrNotRegular) {
		return badf("%s: %v: a tar is a regular file", p, err)
	}
	if err != nil {
		return err
	}
	idx := len(m.tars)
	m.tars = append(m.tars, f)
	magic := make([]byte, 4)
	if n, _ := f.ReadAt(magic, 0); n == 4 {
		switch {
		case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
			return badf("%s: a gzip-compressed file: decompress it first (gunzip -k)", p)
		case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
			return badf("%s: a zstd-compressed file: decompress it first (zstd -d)", p)
		}
	}
	cr := &countingReader{f: f}
	tr := tar.NewReader(cr)
	last := "(the first entry)"
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return badf("%s: after entry %q: %v (a damaged or truncated tar)", p, last, err)
		}
		last = hdr.Name
		name, err := cleanName(hdr.Name)
		if err != nil {
			m.refuse(badf("%s: entry %q: %v", p, hdr.Name, err))
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeReg, '\x00':
			sparse := false
			for k := range hdr.PAXRecords {
				sparse = sparse || strings.HasPrefix(k, "GNU.sparse.")
			}
			if sparse {
				m.refuse(badf("%s: entry %q: a sparse file", p, hdr.Name))
				continue
			}
			if hdr.Size < 0 || cr.pos+hdr.Size > fi.Size() {
				return badf("%s: entry %q: its %d bytes go past the end of the file (a truncated tar)", p, hdr.Name, hdr.Size)
			}
			if old, dup := m.entries[name]; dup {
				// oc-mirror's archives may repeat a file; one path with two sizes is a
				// medium that says two things.
				if old.size != hdr.Size {
					return badf("%s: entry %q: the same path twice, with %d and %d bytes", p, hdr.Name, old.size, hdr.Size)
				}
				continue
			}
			m.entries[name] = entry{size: hdr.Size, tar: idx, off: cr.pos}
		case tar.TypeDir, tar.TypeXGlobalHeader:
		case tar.TypeSymlink:
			m.refuse(badf("%s: entry %q: a symlink (to %q): links are refused", p, hdr.Name, hdr.Linkname))
		case tar.TypeLink:
			m.refuse(badf("%s: entry %q: a hard link (to %q): links are refused", p, hdr.Name, hdr.Linkname))
		default:
			m.refuse(badf("%s: entry %q: of type %q, not a file or a directory", p, hdr.Name, string(hdr.Typeflag)))
		}
	}
	return nil
}

func (m *media) refuse(err error) {
	if m.refused == nil {
		m.refused = err
	}
}

// cleanName is a tar entry's path inside the medium: relative, without "..".
func cleanName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", errors.New("an absolute path")
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errors.New("a path with \"..\"")
		}
	}
	c := path.Clean(name)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// countingReader knows where archive/tar is in the file: right after Next, at the
// entry's data. It seeks, so tar skips data by seeking (and checks the last byte).
type countingReader struct {
	f   *os.File
	pos int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.f.ReadAt(p, c.pos)
	c.pos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (c *countingReader) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		c.pos = off
	case io.SeekCurrent:
		c.pos += off
	default:
		fi, err := c.f.Stat()
		if err != nil {
			return 0, err
		}
		c.pos = fi.Size() + off
	}
	return c.pos, nil
}
