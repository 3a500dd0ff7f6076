package nodegiveback

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/blobstore"
	"github.com/imagepin/imagepin/internal/fsutil"
	"github.com/imagepin/imagepin/original"
)

// ReceiptFile is the receipt's name in the state directory.
const ReceiptFile = "given-back.json"

// Config is where the node's imagepind state lies.
type Config struct {
	StateDir string
	// StoreDir is the blob store's directory ([peers] store_dir, else in StateDir).
	StoreDir string
	// Keep are the names in StateDir left in place besides the receipt (the lock the
	// uninstall holds).
	Keep []string
}

// Deps are the runtime's parts. A nil func is a step this runtime does not have.
type Deps struct {
	// Unpin removes the pins imagepind set (containerd's labels) and returns the images
	// released; CRI-O's pins go with its drop-in and the reload.
	Unpin func(ctx context.Context) ([]string, error)
	// Originals are the records of the files imagepind changed.
	Originals *original.Book
	// Rest is a file's text without imagepind's part in it; nil when the file is
	// imagepind's altogether (a drop-in, a CA it trusts, a hosts.toml it made).
	Rest func(path string, text []byte) []byte
	// Sweep takes imagepind's part out of the runtime's files no record covers (written
	// by an imagepind older than the records) and names the files it changed.
	Sweep func() ([]string, error)
	// Reload makes CRI-O read its configuration again (nil: containerd, which reads
	// hosts.toml at each pull).
	Reload func(ctx context.Context) error
	Now    func() time.Time
	Log    logrus.FieldLogger
}

// File is what uninstall did to one file.
type File struct {
	Path    string           `json:"path"`
	Outcome original.Outcome `json:"outcome"`
}

// Receipt is what a node given back keeps.
type Receipt struct {
	GivenBack time.Time `json:"givenBack"`
	Files     []File    `json:"files"`
	Unpinned  []string  `json:"unpinned,omitempty"`
	Reloaded  bool      `json:"reloaded"`
	// StoreRemoved is the blob store's directory, when one was removed.
	StoreRemoved string `json:"storeRemoved,omitempty"`
}

// ErrNotGivenBack is ReadReceipt's answer on a node not given back.
var ErrNotGivenBack = errors.New("not given back: imagepind uninstall has not finished on this node")

// ReadReceipt is the receipt of stateDir.
func ReadReceipt(stateDir string) (Receipt, error) {
	p := filepath.Join(stateDir, ReceiptFile)
	data, err := fsutil.ReadRegular(p, 4<<20)
	if errors.Is(err, os.ErrNotExist) {
		return Receipt{}, ErrNotGivenBack
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("receipt %s: %w", p, err)
	}
	var r Receipt
	if err := json.Unmarshal(data, &r); err != nil {
		return Receipt{}, fmt.Errorf("receipt %s: %w", p, err)
	}
	if r.GivenBack.IsZero() {
		return Receipt{}, fmt.Errorf("receipt %s: field givenBack missing", p)
	}
	return r, nil
}

// ForgetReceipt removes the receipt: imagepind runs on the node again.
func ForgetReceipt(stateDir string) error {
	return fsutil.RemoveDurable(filepath.Join(stateDir, ReceiptFile))
}

// Run gives the node back; on a node given back already it returns the receipt and
// changes nothing. An error leaves what is not done yet for the next run.
func Run(ctx context.Context, cfg Config, d Deps) (Receipt, error) {
	if r, err := ReadReceipt(cfg.StateDir); err == nil {
		return r, nil
	}
	log := d.Log
	if log == nil {
		log = logrus.New()
	}
	var r Receipt
	if d.Unpin != nil {
		refs, err := d.Unpin(ctx)
		if err != nil {
			return Receipt{}, fmt.Errorf("release the pins: %w", err)
		}
		r.Unpinned = refs
		log.WithField("images", len(refs)).Info("uninstall: pins released; the images stay")
	}
	records, err := d.Originals.Records()
	if err != nil {
		return Receipt{}, err
	}
	for _, rec := range records {
		out, err := restore(rec, d.Rest)
		if err != nil {
			return Receipt{}, err
		}
		r.Files = append(r.Files, File{Path: rec.Path, Outcome: out})
		log.WithField("file", rec.Path).WithField("outcome", out).Info("uninstall: file given back")
	}
	if d.Sweep != nil {
		changed, err := d.Sweep()
		if err != nil {
			return Receipt{}, err
		}
		for _, p := range changed {
			r.Files = append(r.Files, File{Path: p, Outcome: original.Removed})
		}
	}
	if d.Reload != nil {
		if err := d.Reload(ctx); err != nil {
			return Receipt{}, fmt.Errorf("reload CRI-O: %w", err)
		}
		r.Reloaded = true
		log.Info("uninstall: CRI-O reloaded")
	}
	if r.StoreRemoved, err = removeStore(cfg); err != nil {
		return Receipt{}, err
	}
	if err := clearState(cfg); err != nil {
		return Receipt{}, err
	}
	r.GivenBack = time.Now().UTC()
	if d.Now != nil {
		r.GivenBack = d.Now().UTC()
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return Receipt{}, err
	}
	if err := fsutil.WriteAtomic(filepath.Join(cfg.StateDir, ReceiptFile), "", append(data, '\n'), 0o644); err != nil {
		return Receipt{}, fmt.Errorf("write the receipt: %w", err)
	}
	return r, nil
}

// restore puts rec back, reading imagepind's part of the file as it is now and of the
// original (an imagepind older than the records may have written it before).
func restore(rec original.Record, rest func(string, []byte) []byte) (original.Outcome, error) {
	if rest == nil {
		rest = func(string, []byte) []byte { return nil }
	}
	if rec.Exists {
		switch o := rest(rec.Path, rec.Data); {
		case o == nil:
			rec.Exists, rec.Data = false, nil // imagepind's own file, from before the records
		case !bytes.Equal(o, rec.Data):
			rec.Data = o
		}
	}
	var cur original.Current
	text, err := fsutil.ReadRegular(rec.Path, 1<<20)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return "", fmt.Errorf("restore %s: %w", rec.Path, err)
	default:
		cur.Rest = rest(rec.Path, text)
		// A trailing newline imagepind added before its block is not a change.
		cur.Changed = cur.Rest != nil && strings.TrimRight(string(cur.Rest), "\n") != strings.TrimRight(string(rec.Data), "\n")
		if !rec.Exists && len(bytes.TrimSpace(cur.Rest)) == 0 {
			cur.Changed = false
		}
	}
	return original.Restore(rec, cur)
}

// removeStore removes the blob store when it lies outside the state directory (inside,
// clearState does), only when imagepind made it.
func removeStore(cfg Config) (string, error) {
	if cfg.StoreDir == "" {
		return "", nil
	}
	if _, err := os.Stat(cfg.StoreDir); err != nil {
		return "", nil
	}
	if rel, err := filepath.Rel(cfg.StateDir, cfg.StoreDir); err == nil && !strings.HasPrefix(rel, "..") {
		return cfg.StoreDir, nil
	}
	switch err := blobstore.Remove(cfg.StoreDir); {
	case err == nil:
		return cfg.StoreDir, nil
	case errors.Is(err, blobstore.ErrNotAStore):
		return "", nil
	default:
		return "", fmt.Errorf("remove the blob store: %w", err)
	}
}

// clearState removes everything in the state directory but the receipt and cfg.Keep.
func clearState(cfg Config) error {
	entries, err := os.ReadDir(cfg.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(cfg.StateDir, 0o700)
	}
	if err != nil {
		return fmt.Errorf("remove the state: %w", err)
	}
	for _, e := range entries {
		if e.Name() == ReceiptFile || contains(cfg.Keep, e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(cfg.StateDir, e.Name())); err != nil {
			return fmt.Errorf("remove the state: %w", err)
		}
	}
	return fsutil.SyncDir(cfg.StateDir)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Text is the receipt as `imagepind uninstall --status` prints it.
func (r Receipt) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "given back %s\n", r.GivenBack.Format(time.RFC3339))
	for _, f := range r.Files {
		fmt.Fprintf(&b, "  %-9s %s\n", f.Outcome, f.Path)
	}
	if len(r.Unpinned) > 0 {
		fmt.Fprintf(&b, "  released  %d pins (the images stay, subject to the kubelet's image GC)\n", len(r.Unpinned))
	}
	if r.Reloaded {
		b.WriteString("  reloaded  CRI-O\n")
	}
	if r.StoreRemoved != "" {
		fmt.Fprintf(&b, "  removed   blob store %s\n", r.StoreRemoved)
	}
	return b.String()
}
