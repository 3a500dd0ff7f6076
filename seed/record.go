package seed

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// RecordVersion is the version of the record format this package writes.
const RecordVersion = 1

// Record is what a seed put in the store: its images (by repository, tag and digest),
// every manifest (the images' and their indexes' children) and every blob (configs and
// layers) they name, and the media it came from. It is written once the store holds all
// of it (<id>.json); while a seed runs, the same record waits as <id>.pending.json, so
// that imagepind's prune keeps what it has written so far.
type Record struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	// Complete is false in a pending record.
	Complete  bool      `json:"complete"`
	Media     []Media   `json:"media"`
	Images    []Image   `json:"images"`
	Manifests []Content `json:"manifests"`
	Blobs     []Content `json:"blobs"`
	// Bytes are the manifests' and blobs' bytes together.
	Bytes int64 `json:"bytes"`
}

// Media is a medium a seed came from.
type Media struct {
	Path     string    `json:"path"`
	Format   string    `json:"format"`
	Kind     string    `json:"kind"` // directory, tar, tars (oc-mirror's archives)
	SeededAt time.Time `json:"seededAt"`
}

// Image is an image of a seed: a manifest or an index the medium names.
type Image struct {
	// Repository is the full repository ("quay.io/ns/app"); "" when the medium does not
	// say (a tag alone, a registry's storage without Names.Registry, no name at all).
	Repository string `json:"repository,omitempty"`
	// Tag is "" for an image by digest.
	Tag       string        `json:"tag,omitempty"`
	Digest    digest.Digest `json:"digest"`
	MediaType string        `json:"mediaType,omitempty"`
	Size      int64         `json:"size"`
	// MediaName is the name as the medium gives it (an index.json annotation, a
	// registry's repository path and tag); "" for an image the medium does not name.
	MediaName string `json:"mediaName,omitempty"`
}

// Ref is the image as a reference: repository:tag@digest, or what is known of it.
func (i Image) Ref() string {
	s := i.Repository
	if s == "" {
		s = i.MediaName
		if i.Tag != "" && !strings.HasSuffix(s, ":"+i.Tag) {
			s += ":" + i.Tag
		}
	} else if i.Tag != "" {
		s += ":" + i.Tag
	}
	if s == "" {
		return "(no name)@" + i.Digest.String()
	}
	return s + "@" + i.Digest.String()
}

// Content is a manifest or a blob of a seed.
type Content struct {
	Digest    digest.Digest `json:"digest"`
	Size      int64         `json:"size"`
	MediaType string        `json:"mediaType,omitempty"`
}

// Dir is where the records of seeds live under a state directory.
func Dir(stateDir string) string { return filepath.Join(stateDir, "seeds") }

const (
	recordExt  = ".json"
	pendingExt = ".pending.json"
	lockName   = "lock"
	// maxRecord bounds a record read back (an OpenShift release is a few MiB).
	maxRecord = 256 << 20
)

// recordID is a seed's id: its images, whatever medium carried them.
func recordID(images []Image) string {
	lines := make([]string, 0, len(images))
	for _, i := range images {
		lines = append(lines, i.Repository+"\t"+i.Tag+"\t"+i.Digest.String()+"\t"+i.MediaName)
	}
	sort.Strings(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:])[:16]
}

// isID says whether s has the shape of a seed's id.
func isID(s string) bool {
	if len(s) != 16 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func readRecord(file string) (*Record, error) {
	b, err := fsutil.ReadRegular(file, maxRecord)
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("seed record %s: %w", file, err)
	}
	if r.Version != RecordVersion {
		return nil, fmt.Errorf("seed record %s: version %d (this reads %d)", file, r.Version, RecordVersion)
	}
	return &r, nil
}

func writeRecord(dir string, r *Record, ext string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteAtomic(filepath.Join(dir, r.ID+ext), "", append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("seed record %s: %w", r.ID, err)
	}
	return nil
}

// Records are the seeds recorded in dir, complete and pending, by id (a pending one
// only when no complete one has its id).
func Records(dir string) ([]*Record, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("seed records: %w", err)
	}
	byID := map[string]*Record{}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, recordExt) || strings.HasPrefix(name, ".") {
			continue
		}
		r, err := readRecord(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if old, ok := byID[r.ID]; ok && old.Complete {
			continue
		}
		byID[r.ID] = r
	}
	out := make([]*Record, 0, len(byID))
	for _, r := range byID {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Digests are every manifest and blob a seed record in dir names, complete or pending:
// what imagepind's prune keeps in the store. An unreadable record is an error, so that
// the caller prunes nothing rather than a seed's blobs.
func Digests(dir string) ([]digest.Digest, error) {
	recs, err := Records(dir)
	if err != nil {
		return nil, err
	}
	var out []digest.Digest
	for _, r := range recs {
		for _, c := range r.Manifests {
			out = append(out, c.Digest)
		}
		for _, c := range r.Blobs {
			out = append(out, c.Digest)
		}
	}
	return out, nil
}

// ErrLocked means another imagepinctl seed is at work on this node.
var ErrLocked = errors.New("another imagepinctl seed is running on this node")

// lock takes dir's lock (flock: a kill -9 never leaves it held).
func lock(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("seed records: %w", err)
	}
	unlock, err := fsutil.TryLock(filepath.Join(dir, lockName))
	switch {
	case errors.Is(err, fsutil.ErrLocked):
		return nil, ErrLocked
	case err != nil:
		return nil, fmt.Errorf("seed lock: %w", err)
	}
	return unlock, nil
}
