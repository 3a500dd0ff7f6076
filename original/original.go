package original

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// maxFile bounds what is kept of one file (a runtime's config file is a few KiB).
const maxFile = 1 << 20

// Record is what a path held before imagepind first changed it.
type Record struct {
	Path string `json:"path"`
	// Exists false: there was no file at Path.
	Exists bool   `json:"exists"`
	Data   []byte `json:"data,omitempty"`
	// Mode is the file's permission bits (with setuid, setgid and sticky); UID and GID
	// its owner.
	Mode uint32 `json:"mode,omitempty"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Dirs are the directories above Path that did not exist, the outermost first:
	// imagepind made them, and uninstall removes them when they are empty.
	Dirs []string  `json:"dirs,omitempty"`
	At   time.Time `json:"at"`
}

// Book is the records of one state directory: one file a path, in Dir. A nil Book keeps
// nothing.
type Book struct {
	Dir string
	Now func() time.Time
}

// New is the book in stateDir's "originals" directory.
func New(stateDir string) *Book { return &Book{Dir: filepath.Join(stateDir, "originals")} }

func (b *Book) file(path string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(path)))
	return filepath.Join(b.Dir, hex.EncodeToString(sum[:12])+".json")
}

// Keep records what path holds now, unless it was recorded before: call it before each
// change to path. A path that cannot be recorded (not a regular file, unreadable) is an
// error, and the caller must leave the path as it is.
func (b *Book) Keep(path string) error {
	if b == nil {
		return nil
	}
	path = filepath.Clean(path)
	rec := b.file(path)
	if _, err := os.Stat(rec); err == nil {
		return nil
	}
	r := Record{Path: path, UID: -1, GID: -1, At: time.Now().UTC()}
	if b.Now != nil {
		r.At = b.Now().UTC()
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		for d := filepath.Dir(path); d != filepath.Dir(d); d = filepath.Dir(d) {
			if _, err := os.Lstat(d); err == nil {
				break
			} else if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("record the original of %s: %w", path, err)
			}
			r.Dirs = append([]string{d}, r.Dirs...)
		}
	case err != nil:
		return fmt.Errorf("record the original of %s: %w", path, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("record the original of %s: not a regular file (%s); imagepind leaves it as it is", path, fi.Mode().Type())
	default:
		data, err := fsutil.ReadRegular(path, maxFile)
		if err != nil {
			return fmt.Errorf("record the original of %s: %w", path, err)
		}
		r.Exists, r.Data, r.Mode = true, data, uint32(fi.Mode().Perm()|fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			r.UID, r.GID = int(st.Uid), int(st.Gid)
		}
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(b.Dir, 0o700); err != nil {
		return fmt.Errorf("record the original of %s: %w", path, err)
	}
	if err := fsutil.WriteAtomic(rec, "", append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("record the original of %s: %w", path, err)
	}
	return nil
}

// Records are every record of the book, by path. A record that does not read is an
// error naming its file: uninstall must not guess what a path held.
func (b *Book) Records() ([]Record, error) {
	if b == nil {
		return nil, nil
	}
	entries, err := os.ReadDir(b.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range entries {
		if e.IsDir() || filepath.Ext(e.Name()) != ".json" {
			continue
		}
		p := filepath.Join(b.Dir, e.Name())
		data, err := fsutil.ReadRegular(p, 4*maxFile)
		if err != nil {
			return nil, fmt.Errorf("original record %s: %w", p, err)
		}
		var r Record
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("original record %s: %w", p, err)
		}
		if r.Path == "" || !filepath.IsAbs(r.Path) {
			return nil, fmt.Errorf("original record %s: field path %q is not an absolute path", p, r.Path)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Outcome is what Restore did to a path.
type Outcome string

const (
	// Unchanged: the path already held its original.
	Unchanged Outcome = "unchanged"
	// Removed: imagepind had made the file; it is gone (with the directories it made, when empty).
	Removed Outcome = "removed"
	// Restored: the administrator's file has its bytes, mode and owner back.
	Restored Outcome = "restored"
	// Kept: the administrator changed the file after imagepind first did; it keeps
	// their content with imagepind's part taken out (Current.Rest), its mode and owner.
	Kept Outcome = "kept"
)

// Current is what a path holds now, as the caller reads imagepind's part in it.
type Current struct {
	// Rest is the file without imagepind's part; nil when the file is imagepind's
	// altogether (or there is none).
	Rest []byte
	// Changed says Rest is not the original: the administrator changed the file since.
	Changed bool
}

// Restore puts r back: the original file (bytes, mode, owner) or no file, then removes
// the directories imagepind made when they are empty. cur says what the path holds now;
// when the administrator changed it since (cur.Changed), their content is kept, without
// imagepind's part (cur.Rest), its mode and owner as now.
func Restore(r Record, cur Current) (Outcome, error) {
	fi, err := os.Lstat(r.Path)
	exists := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("restore %s: %w", r.Path, err)
	}
	out := Unchanged
	switch {
	case cur.Changed && cur.Rest != nil:
		now, _ := fsutil.ReadRegular(r.Path, maxFile)
		if !bytes.Equal(now, cur.Rest) {
			if err := fsutil.WriteAtomic(r.Path, "", cur.Rest, fi.Mode().Perm()); err != nil {
				return "", fmt.Errorf("restore %s: %w", r.Path, err)
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				if err := os.Chown(r.Path, int(st.Uid), int(st.Gid)); err != nil {
					return "", fmt.Errorf("restore %s: %w", r.Path, err)
				}
			}
		}
		out = Kept
	case !r.Exists:
		if exists {
			if err := fsutil.RemoveDurable(r.Path); err != nil {
				return "", fmt.Errorf("restore %s: %w", r.Path, err)
			}
			out = Removed
		}
	default:
		if !exists || !same(r, fi) {
			mode := os.FileMode(r.Mode).Perm() | os.FileMode(r.Mode)&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
			if err := os.MkdirAll(filepath.Dir(r.Path), 0o755); err != nil {
				return "", fmt.Errorf("restore %s: %w", r.Path, err)
			}
			if err := fsutil.WriteAtomic(r.Path, "", r.Data, mode); err != nil {
				return "", fmt.Errorf("restore %s: %w", r.Path, err)
			}
			if r.UID >= 0 {
				if err := os.Lchown(r.Path, r.UID, r.GID); err != nil {
					return "", fmt.Errorf("restore %s: owner %d:%d: %w", r.Path, r.UID, r.GID, err)
				}
			}
			// chown clears setuid and setgid: the mode once more.
			if err := os.Chmod(r.Path, mode); err != nil {
				return "", fmt.Errorf("restore %s: %w", r.Path, err)
			}
			out = Restored
		}
	}
	for i := len(r.Dirs) - 1; i >= 0; i-- {
		if err := os.Remove(r.Dirs[i]); err == nil && out == Unchanged {
			out = Removed
		}
	}
	return out, nil
}

// same says the file fi at r.Path holds r exactly: bytes, mode and owner.
func same(r Record, fi os.FileInfo) bool {
	if !fi.Mode().IsRegular() || uint32(fi.Mode().Perm()|fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)) != r.Mode {
		return false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && r.UID >= 0 && (int(st.Uid) != r.UID || int(st.Gid) != r.GID) {
		return false
	}
	data, err := fsutil.ReadRegular(r.Path, maxFile)
	return err == nil && bytes.Equal(data, r.Data)
}
