//go:build e2e

package e2e

import (
	"strings"
	"testing"

	"github.com/imagepin/imagepin/cri/critest"
	"github.com/imagepin/imagepin/crio"
)

// The same suite as cri/fakecri's, against real CRI-O.
func TestCRIOConformance(t *testing.T) {
	critest.Run(t, func(t *testing.T) critest.Subject {
		w := newWorld(t)
		refs := w.push("conf", 2)
		missing := w.reg.Host + "/conf-0@sha256:" + strings.Repeat("0", 64)
		return critest.Subject{
			Runtime: w.cri, Live: crio.NewLiveConfig(w.crio.Socket), Reloader: crio.SignalReloader{Socket: w.crio.Socket},
			DropIn:    crio.DropIn{MainConfig: w.crio.Config, ConfigDir: w.crio.ConfigDir},
			Available: [2]string{refs[0], refs[1]}, Missing: missing,
		}
	})
}
