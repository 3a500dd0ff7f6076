package fakeruntime_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/pin/pintest"
	"github.com/imagepin/imagepin/test/fakeruntime"
)

func img(n int) string { return fmt.Sprintf("registry.example/app@sha256:%064x", n) }

func TestConformance(t *testing.T) {
	pintest.Run(t, func(t *testing.T) pintest.Subject {
		root := t.TempDir()
		d := crio.DropIn{MainConfig: filepath.Join(root, "crio.conf"), ConfigDir: filepath.Join(root, "crio.conf.d")}
		os.MkdirAll(d.ConfigDir, 0o755)
		rt := fakeruntime.New(d)
		rt.Registry[img(1)], rt.Registry[img(2)] = nil, nil
		return pintest.Subject{
			Name: "cri-o", Runtime: rt, Pinner: &crio.Pinner{DropIn: d, Live: rt, Reloader: rt},
			PinByHand: func(_ context.Context, ref string) error {
				return os.WriteFile(filepath.Join(d.ConfigDir, "10-admin.conf"), []byte(fmt.Sprintf("[crio.image]\npinned_images = [%q]\n", ref)), 0o644)
			},
			Available: [2]string{img(1), img(2)}, Missing: img(3),
		}
	})
}

func TestContainerdConformance(t *testing.T) {
	pintest.Run(t, func(t *testing.T) pintest.Subject {
		rt := fakeruntime.NewContainerd()
		rt.Registry[img(1)], rt.Registry[img(2)] = nil, nil
		return pintest.Subject{
			Name: "containerd", Runtime: rt,
			Pinner:       &containerd.Pinner{Images: rt, Namespace: "k8s.io", Record: filepath.Join(t.TempDir(), "labels.json")},
			PinByHand:    func(ctx context.Context, ref string) error { return rt.SetPinned(ctx, ref, true) },
			RepullUnpins: true,
			Available:    [2]string{img(1), img(2)}, Missing: img(3),
		}
	})
}
