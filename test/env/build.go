package env

import (
	"fmt"
	"os"
	"os/exec"
)

// GoBuild builds the module's package pkg into out, static (test helpers run inside
// containers and by CRI-O); ldflags may be "".
func GoBuild(out, pkg, ldflags string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}
