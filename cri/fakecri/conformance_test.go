package fakecri_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/imagepin/imagepin/cri/critest"
	"github.com/imagepin/imagepin/cri/fakecri"
	"github.com/imagepin/imagepin/crio"
)

func TestConformance(t *testing.T) {
	critest.Run(t, func(t *testing.T) critest.Subject {
		root := t.TempDir()
		d := crio.DropIn{MainConfig: filepath.Join(root, "crio.conf"), ConfigDir: filepath.Join(root, "crio.conf.d")}
		os.MkdirAll(d.ConfigDir, 0o755)
		rt := fakecri.New(d)
		img := func(n int) string { return fmt.Sprintf("registry.example/app@sha256:%064x", n) }
		rt.Registry[img(1)], rt.Registry[img(2)] = nil, nil
		return critest.Subject{Runtime: rt, Live: rt, Reloader: rt, DropIn: d, Available: [2]string{img(1), img(2)}, Missing: img(3)}
	})
}
