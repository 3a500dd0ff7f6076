//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/pin/pintest"
)

// The same suite as cri/fakecri's, against real CRI-O.
func TestCRIOConformance(t *testing.T) {
	pintest.Run(t, func(t *testing.T) pintest.Subject {
		w := newWorld(t)
		refs := w.push("conf", 2)
		missing := w.reg.Host + "/conf-0@sha256:" + strings.Repeat("0", 64)
		return pintest.Subject{
			Name: "cri-o", Runtime: w.cri, PullReturnsRepoDigest: !crioSupport(t).PullReturnsImageID,
			Pinner: &crio.Pinner{
				DropIn: crio.DropIn{MainConfig: w.crio.Config, ConfigDir: w.crio.ConfigDir},
				Live:   crio.NewLiveConfig(w.crio.Socket), Reloader: crio.SignalReloader{Socket: w.crio.Socket},
				Settle: crio.ReloadSettle,
			},
			PinByHand: func(_ context.Context, ref string) error {
				return os.WriteFile(filepath.Join(w.crio.ConfigDir, "10-admin.conf"), []byte(fmt.Sprintf("[crio.image]\npinned_images = [%q]\n", ref)), 0o644)
			},
			Available: [2]string{refs[0], refs[1]}, Missing: missing,
		}
	})
}

// The same suite against real containerd 2.x.
func TestContainerdConformance(t *testing.T) {
	pintest.Run(t, func(t *testing.T) pintest.Subject {
		w := newContainerdWorld(t, nil)
		refs := w.push("conf", 2)
		missing := w.reg.Host + "/conf-0@sha256:" + strings.Repeat("0", 64)
		images := w.containerdImages()
		return pintest.Subject{
			Name: "containerd", Runtime: w.cri,
			Pinner:       &containerd.Pinner{Images: images, Namespace: "k8s.io", Record: filepath.Join(t.TempDir(), "labels.json")},
			PinByHand:    func(ctx context.Context, ref string) error { return images.SetPinned(ctx, ref, true) },
			RepullUnpins: true,
			Available:    [2]string{refs[0], refs[1]}, Missing: missing,
		}
	})
}
