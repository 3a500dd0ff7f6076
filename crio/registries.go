package crio

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"go.podman.io/image/v5/pkg/sysregistriesv2"
	"go.podman.io/image/v5/types"

	"github.com/imagepin/imagepin/internal/fsutil"
)

// MirrorDropInName is imagepind's registries.conf.d drop-in (peers): read
// last of the usual names, so that its entries are the ones CRI-O keeps.
const MirrorDropInName = "zz-imagepin-mirror.conf"

// AdminRegistry finds the registries.conf entry an administrator wrote for a prefix
// (the longest prefix match, as containers/image does), nil when there is none.
type AdminRegistry func(prefix string) (*sysregistriesv2.Registry, error)

// AdminFiles are the registries.conf and drop-ins CRI-O reads, without imagepind's own
// drop-in: Scratch, a directory of imagepind's, holds a copy of the drop-ins that the
// node-local mirror's own registry access reads (so that it never asks itself). Read is
// called on every pin write: it rewrites the copy only when a file changed, each file
// atomically, so a reader of Scratch never sees it half written.
type AdminFiles struct {
	Main, Dir, Scratch string
	seen               [sha256.Size]byte
}

// Read brings Scratch up to date and returns the lookup, and whether anything changed
// since the last Read.
func (a *AdminFiles) Read() (AdminRegistry, bool, error) {
	files := map[string][]byte{}
	entries, err := os.ReadDir(a.Dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, false, fmt.Errorf("registries drop-ins %s: %w", a.Dir, err)
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == MirrorDropInName || !strings.HasSuffix(e.Name(), ".conf") {
			continue
		}
		data, err := fsutil.ReadRegular(filepath.Join(a.Dir, e.Name()), 1<<20)
		if err != nil {
			return nil, false, fmt.Errorf("registries drop-in %s: %w", e.Name(), err)
		}
		files[e.Name()] = data
	}
	main, err := fsutil.ReadRegular(a.Main, 1<<20)
	if err != nil && !os.IsNotExist(err) {
		return nil, false, fmt.Errorf("registries.conf %s: %w", a.Main, err)
	}
	h := sha256.New()
	h.Write(main)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(h, "\x00%s\x00%d\x00", n, len(files[n]))
		h.Write(files[n])
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	sys := &types.SystemContext{SystemRegistriesConfPath: a.Main, SystemRegistriesConfDirPath: a.Scratch}
	lookup := func(prefix string) (*sysregistriesv2.Registry, error) {
		return sysregistriesv2.FindRegistry(sys, prefix)
	}
	if sum == a.seen {
		return lookup, false, nil
	}
	if err := a.sync(files); err != nil {
		return nil, false, err
	}
	sysregistriesv2.InvalidateCache()
	if _, err := sysregistriesv2.GetRegistries(sys); err != nil {
		return nil, false, fmt.Errorf("registries.conf: %w", err)
	}
	a.seen = sum
	return lookup, true, nil
}

// sync makes Scratch hold exactly files, writing each atomically.
func (a *AdminFiles) sync(files map[string][]byte) error {
	if err := os.MkdirAll(a.Scratch, 0o700); err != nil {
		return err
	}
	for n, data := range files {
		if old, err := os.ReadFile(filepath.Join(a.Scratch, n)); err == nil && bytes.Equal(old, data) {
			continue
		}
		// The temp file's name does not end in .conf: containers/image skips it.
		if err := fsutil.WriteAtomic(filepath.Join(a.Scratch, n), "", data, 0o600); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(a.Scratch)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep {
			if err := os.RemoveAll(filepath.Join(a.Scratch, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// MirrorDropIn is the drop-in that puts the node-local mirror (host:port, plain HTTP on
// loopback) first for each repository, by digest only, followed by what the
// administrator configured for it: the location, insecure, blocked and mirrors of the
// entry that matched, rewritten for the repository as containers/image rewrites
// references. A registries.conf.d entry replaces an earlier one with the same prefix,
// so the administrator's mirrors are carried in, never dropped. The mirror being down
// makes containers/image go on to the next endpoint.
//
// path is how the mirror names a source repository in its paths (mirror.PathFor).
func MirrorDropIn(local string, repos []string, admin AdminRegistry, path func(string) string) ([]byte, error) {
	return mirrorDropIn(local, nil, repos, admin, path)
}

// mirrorDropIn is MirrorDropIn with, for each repository tags (when not nil) names an
// endpoint for (host:port), the mirror's TLS endpoint for tags before everything, for
// tags only (MirrorRegistries.Tags).
func mirrorDropIn(local string, tags func(repo string) string, repos []string, admin AdminRegistry, path func(string) string) ([]byte, error) {
	repos = append([]string(nil), repos...)
	sort.Strings(repos)
	var file struct {
		Registries []sysregistriesv2.Registry `toml:"registry"`
	}
	seen := map[string]bool{}
	for _, repo := range repos {
		if seen[repo] {
			continue
		}
		seen[repo] = true
		ours := sysregistriesv2.Endpoint{Location: local + "/" + path(repo), Insecure: true, PullFromMirror: sysregistriesv2.MirrorByDigestOnly}
		r := sysregistriesv2.Registry{Prefix: repo, Endpoint: sysregistriesv2.Endpoint{Location: repo}}
		if tags != nil {
			if at := tags(repo); at != "" {
				r.Mirrors = append(r.Mirrors, tagEndpoint(at, repo, path))
			}
		}
		a, err := admin(repo)
		if err != nil {
			return nil, err
		}
		if a != nil {
			rest := repo[matchLen(a.Prefix, repo):]
			if a.Location != "" {
				r.Location = a.Location + rest
			}
			r.Insecure, r.Blocked = a.Insecure, a.Blocked
			r.Mirrors = append(r.Mirrors, ours)
			for _, m := range a.Mirrors {
				m.Location += rest
				if m.PullFromMirror == "" && a.MirrorByDigestOnly {
					m.PullFromMirror = sysregistriesv2.MirrorByDigestOnly
				}
				r.Mirrors = append(r.Mirrors, m)
			}
		} else {
			r.Mirrors = append(r.Mirrors, ours)
		}
		file.Registries = append(file.Registries, r)
	}
	var b bytes.Buffer
	b.WriteString("# Written by imagepind. Do not edit: the node-local mirror first for the repositories\n# of pinned images, then the mirrors configured for them elsewhere (carried in).\n")
	if err := toml.NewEncoder(&b).Encode(file); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// matchLen is how much of repo the prefix matches, as containers/image's
// refMatchingPrefix counts it: the host for "*.example.com", else the prefix.
func matchLen(prefix, repo string) int {
	if strings.HasPrefix(prefix, "*.") {
		if i := strings.Index(repo, "/"); i >= 0 {
			return i
		}
		return len(repo)
	}
	return len(prefix)
}
