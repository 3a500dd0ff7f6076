package env

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// VersionLine is the first line a binary of the cache prints for its version: `crio
// --version`, `containerd --version`, `kubelet --version` ("crio version 1.36.3",
// "containerd github.com/containerd/containerd/v2 v2.4.2", "Kubernetes v1.36.3"). The
// e2e tier runs on whichever pair the cache holds (make test, make test-versions) and
// asserts the version the runtime reports against it.
func VersionLine(binary string) (string, error) {
	path := filepath.Join(CacheDir(), binary)
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line), nil
}

// RuntimeVersion is the version CRI's Version call reports for the runtime binary of
// the cache ("crio" or "containerd"): the last word of its --version line ("1.36.3",
// "v2.4.2").
func RuntimeVersion(binary string) (string, error) {
	line, err := VersionLine(binary)
	if err != nil {
		return "", err
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", fmt.Errorf("%s --version printed nothing", binary)
	}
	return f[len(f)-1], nil
}
