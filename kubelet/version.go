package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// Version is the kubelet's version as far as it is known: Text as the kubelet prints it
// ("v1.35.4") and From where it was read; Text "" when it is not known, From then says
// why.
type Version struct {
	Major, Minor int
	Text, From   string
}

// Known says whether the version was read.
func (v Version) Known() bool { return v.Text != "" }

// atLeast compares the version's major and minor.
func (v Version) atLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// VersionSource tells the version of the kubelet that runs, or will run, on the node.
type VersionSource interface {
	KubeletVersion() Version
}

// VersionFunc is a VersionSource of a function (tests, a Node's kubeletVersion).
type VersionFunc func() Version

// KubeletVersion calls f.
func (f VersionFunc) KubeletVersion() Version { return f() }

// versionPattern finds the version in `kubelet --version`, which prints "Kubernetes
// v1.35.4" (k8s.io/component-base/version/verflag: the program name "Kubernetes" and
// version.Get()); distributions add a suffix ("v1.35.4+rke2r1", "v1.35.4-dirty").
var versionPattern = regexp.MustCompile(`Kubernetes v(\d+)\.(\d+)\.\d+\S*`)

// ParseVersion reads the version out of `kubelet --version`'s output.
func ParseVersion(out string) (Version, error) {
	m := versionPattern.FindStringSubmatch(out)
	if m == nil {
		return Version{}, fmt.Errorf("no \"Kubernetes vX.Y.Z\" in %q", trim(out, 200))
	}
	major, err1 := strconv.Atoi(m[1])
	minor, err2 := strconv.Atoi(m[2])
	if err := errors.Join(err1, err2); err != nil {
		return Version{}, fmt.Errorf("version %q: %w", m[0], err)
	}
	return Version{Major: major, Minor: minor, Text: m[0][len("Kubernetes "):]}, nil
}

// Binary reads the version of the kubelet binary at Path by running it with --version:
// at most Timeout (then WaitDelay for its output to close), at most maxVersionOutput
// bytes of output kept. The answer is kept for as long as the binary's modification
// time and size stay the same; a failure is tried again after RetryAfter. A missing
// binary (a node where the kubelet is not installed yet) is not run.
type Binary struct {
	Path       string
	Timeout    time.Duration
	RetryAfter time.Duration
	Now        func() time.Time

	mu     sync.Mutex
	cached binaryAnswer
}

type binaryAnswer struct {
	mtime time.Time
	size  int64
	at    time.Time
	v     Version
}

const maxVersionOutput = 4096

// NewBinary reads the version of the kubelet at path: 5 s to answer, a failure tried
// again after 10 minutes.
func NewBinary(path string) *Binary {
	return &Binary{Path: path, Timeout: 5 * time.Second, RetryAfter: 10 * time.Minute, Now: time.Now}
}

// KubeletVersion runs the binary, or answers from the last run of the same binary.
func (b *Binary) KubeletVersion() Version {
	b.mu.Lock()
	defer b.mu.Unlock()
	from := b.Path + " --version"
	st, err := os.Stat(b.Path)
	if err != nil {
		return Version{From: fmt.Sprintf("%s: %v", from, err)}
	}
	if !st.Mode().IsRegular() {
		return Version{From: fmt.Sprintf("%s: not a regular file", from)}
	}
	c := b.cached
	if c.at != (time.Time{}) && c.mtime.Equal(st.ModTime()) && c.size == st.Size() &&
		(c.v.Known() || b.Now().Sub(c.at) < b.RetryAfter) {
		return c.v
	}
	v := b.run(from)
	b.cached = binaryAnswer{mtime: st.ModTime(), size: st.Size(), at: b.Now(), v: v}
	return v
}

func (b *Binary) run(from string) Version {
	ctx, cancel := context.WithTimeout(context.Background(), b.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Path, "--version")
	out := &capped{max: maxVersionOutput}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
	// A child of the binary holding its output open does not hold us past this.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return Version{From: fmt.Sprintf("%s: no answer within %s", from, b.Timeout)}
	}
	if err != nil {
		return Version{From: fmt.Sprintf("%s: %v: %s", from, err, trim(string(out.buf), 200))}
	}
	v, err := ParseVersion(string(out.buf))
	if err != nil {
		return Version{From: fmt.Sprintf("%s: %v", from, err)}
	}
	v.From = from
	return v
}

// capped keeps the first max bytes written to it and drops the rest.
type capped struct {
	buf []byte
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - len(c.buf); room > 0 {
		c.buf = append(c.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
