package crio

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/imagepin/imagepin/pin"

	"github.com/BurntSushi/toml"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// ManagedFileName is imagepind's drop-in. The fixed UUID keeps administrators' files
// from colliding with it; "zz-" sorts it after numbered and lowercase names.
const ManagedFileName = "zz-imagepin-6f1c2a8e-3b7d-4e59-9a41-2c8d5e7f0b13.conf"

// maxConfigFileSize bounds what we read of CRI-O's config files.
const maxConfigFileSize = 8 << 20

// DropIn is the managed drop-in of one CRI-O config directory.
type DropIn struct {
	// MainConfig is crio.conf; ConfigDir is crio.conf.d.
	MainConfig string
	ConfigDir  string
	// Cache, when set, spares re-reading files that did not change (NewFileCache).
	Cache *FileCache
	// Originals, when set, records what the drop-in's path held before imagepind first
	// writes it (original.Book), for uninstall.
	Originals Originals
}

// Originals records what a path held before imagepind first changes it
// (original.Book.Keep); an error leaves the path as it is.
type Originals interface {
	Keep(path string) error
}

func keep(o Originals, path string) error {
	if o == nil {
		return nil
	}
	return o.Keep(path)
}

// Path is the managed drop-in's path.
func (d DropIn) Path() string { return filepath.Join(d.ConfigDir, ManagedFileName) }

// ConfigFile is one of CRI-O's config files, in the order CRI-O reads them.
type ConfigFile struct {
	Path string
	// SetsPins says whether the file sets [crio.image] pinned_images (even to []).
	SetsPins bool
	Pins     []string
	Managed  bool
	Err      error
}

// Scan reads crio.conf and every file of crio.conf.d in CRI-O's order (crio.conf, then a
// lexical walk of the directory, recursively, any name).
func (d DropIn) Scan() []ConfigFile {
	var files []ConfigFile
	if cf, ok := d.Cache.read(d.MainConfig); ok {
		files = append(files, cf)
	}
	_ = filepath.Walk(d.ConfigDir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				files = append(files, ConfigFile{Path: p, Err: err})
			}
			return nil
		}
		if info.IsDir() {
			return nil
		}
		cf, ok := d.Cache.read(p)
		if ok {
			cf.Managed = p == d.Path()
			files = append(files, cf)
		}
		return nil
	})
	return files
}

func readConfigFile(path string) (ConfigFile, bool) {
	data, cf, exists := readConfigData(path)
	if !exists || cf.Err != nil {
		return cf, exists
	}
	return parseConfigFile(path, data), true
}

// readConfigData reads a config file's bytes; exists is false when it is absent, and a
// file that cannot be read is cf.Err.
func readConfigData(path string) (data []byte, cf ConfigFile, exists bool) {
	cf = ConfigFile{Path: path}
	data, err := fsutil.ReadRegular(path, maxConfigFileSize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, cf, false
	}
	if err != nil {
		cf.Err = err
	}
	return data, cf, true
}

func parseConfigFile(path string, data []byte) ConfigFile {
	cf := ConfigFile{Path: path}
	pins, set, err := decodePins(data)
	if err != nil {
		cf.Err = fmt.Errorf("parse: %w", err)
		return cf
	}
	cf.SetsPins, cf.Pins = set, pins
	return cf
}

// decodePins reads [crio.image] pinned_images from CRI-O TOML; set says whether the key
// is there at all (even as []), since only then does it replace earlier files' list.
func decodePins(data []byte) (pins []string, set bool, err error) {
	var doc struct {
		Crio struct {
			Image struct {
				PinnedImages []string `toml:"pinned_images"`
			} `toml:"image"`
		} `toml:"crio"`
	}
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		return nil, false, err
	}
	return doc.Crio.Image.PinnedImages, md.IsDefined("crio", "image", "pinned_images"), nil
}

// ExistingPins summarises the other files' pins for the managed drop-in.
type ExistingPins struct {
	// Inherited are the patterns of the files read before ours (crio.conf and earlier
	// drop-ins), in order, deduplicated: ours replaces them, so it copies them in.
	Inherited []string
	// Overriders are files read after ours that set pinned_images: CRI-O uses the last
	// of them, not ours.
	Overriders []string
	// Skipped are patterns that cannot be copied safely (a bare "*" kills CRI-O).
	Skipped []string
	// Errors are files that cannot be read or parsed (CRI-O's reload would fail too).
	Errors []error
}

// Existing reads the pins of every config file but ours.
func (d DropIn) Existing(files []ConfigFile) ExistingPins {
	var ex ExistingPins
	seen := map[string]bool{}
	afterOurs := false
	for _, f := range files {
		if f.Managed {
			continue
		}
		if d.readAfterManaged(f.Path) {
			afterOurs = true
		}
		if f.Err != nil {
			ex.Errors = append(ex.Errors, fmt.Errorf("%s: %w", f.Path, f.Err))
			continue
		}
		if !f.SetsPins {
			continue
		}
		if afterOurs {
			ex.Overriders = append(ex.Overriders, f.Path)
			continue
		}
		for _, p := range f.Pins {
			if err := pin.ValidPattern(p); err != nil {
				ex.Skipped = append(ex.Skipped, fmt.Sprintf("%s: %v", f.Path, err))
				continue
			}
			if !seen[p] {
				seen[p] = true
				ex.Inherited = append(ex.Inherited, p)
			}
		}
	}
	return ex
}

// Effective is the pinned_images CRI-O ends up with when our drop-in holds ours (nil:
// no drop-in): the list of the last file that sets it.
func (d DropIn) Effective(files []ConfigFile, ours []string) []string {
	var eff []string
	placed := false
	place := func() {
		if !placed && ours != nil {
			eff = ours
		}
		placed = true
	}
	for _, f := range files {
		if f.Managed {
			continue
		}
		if !placed && d.readAfterManaged(f.Path) {
			place()
		}
		if f.Err == nil && f.SetsPins {
			eff = f.Pins
		}
	}
	place()
	return nonEmpty(eff)
}

// readAfterManaged says whether CRI-O reads path after our drop-in. filepath.Walk visits
// a directory's entries in name order, so what counts is the top-level entry's name.
func (d DropIn) readAfterManaged(path string) bool {
	rel, err := filepath.Rel(d.ConfigDir, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return false
	}
	top, _, _ := strings.Cut(rel, string(filepath.Separator))
	return top > ManagedFileName
}

func nonEmpty(in []string) []string {
	out := []string{}
	for _, p := range in {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Render returns the drop-in's content for the given patterns: sorted, deduplicated.
// Patterns that fail ValidPattern are an error: the caller validated them already, so
// this is the last line of defence for CRI-O's config.
func Render(patterns []string) ([]byte, error) {
	ps := slices.Clone(patterns)
	sort.Strings(ps)
	ps = slices.Compact(ps)
	for _, p := range ps {
		if err := pin.ValidPattern(p); err != nil {
			return nil, err
		}
	}
	var b bytes.Buffer
	b.WriteString("# Written by imagepind. Do not edit: it is rewritten from the PinnedImageSet\n")
	b.WriteString("# files and from the pinned_images of CRI-O's other config files.\n")
	b.WriteString("[crio.image]\npinned_images = [\n")
	// One pattern a line, quoted as CRI-O's own template does (%q); the parse-back
	// below proves the TOML reads back to exactly these strings.
	for _, p := range ps {
		fmt.Fprintf(&b, "\t%q,\n", p)
	}
	b.WriteString("]\n")
	// Parse it back: CRI-O must be able to read whatever we write.
	back, _, err := decodePins(b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("rendered drop-in does not parse: %w", err)
	}
	if !slices.Equal(back, ps) {
		return nil, errors.New("rendered drop-in does not read back to the same patterns")
	}
	return b.Bytes(), nil
}

// Apply makes the drop-in hold exactly the given patterns: written atomically (the temp
// file in the config directory's parent, since CRI-O parses every file of the directory),
// only when its content changes, and removed when there is nothing to pin. It reports
// whether the file changed.
func (d DropIn) Apply(patterns []string) (bool, error) {
	path := d.Path()
	old, err := fsutil.ReadRegular(path, maxConfigFileSize)
	exists := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		// Not a regular file, unreadable: replace it.
		exists = true
		old = nil
	}
	if len(patterns) == 0 {
		if !exists {
			return false, nil
		}
		if err := fsutil.RemoveDurable(path); err != nil {
			return false, fmt.Errorf("remove drop-in: %w", err)
		}
		return true, nil
	}
	content, err := d.Cache.render(patterns)
	if err != nil {
		return false, err
	}
	if exists && bytes.Equal(old, content) {
		return false, nil
	}
	if err := keep(d.Originals, path); err != nil {
		return false, err
	}
	if err := os.MkdirAll(d.ConfigDir, 0o755); err != nil {
		return false, fmt.Errorf("create %s: %w", d.ConfigDir, err)
	}
	if err := fsutil.WriteAtomic(path, filepath.Dir(d.ConfigDir), content, 0o644); err != nil {
		return false, fmt.Errorf("write drop-in: %w", err)
	}
	return true, nil
}
