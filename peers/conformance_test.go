package peers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/imagepin/imagepin/containerd"
	"github.com/imagepin/imagepin/crio"
	"github.com/imagepin/imagepin/pin"
	"github.com/imagepin/imagepin/pin/pintest"
	"github.com/imagepin/imagepin/test/fakeruntime"
)

type noFiles struct{}

func (noFiles) Render([]string) (bool, error) { return false, nil }

func img(n int) string { return fmt.Sprintf("registry.example/app@sha256:%064x", n) }

// The runtime port with the node-local mirror in front is still the runtime port: the
// conformance suite on both fakes, through Node.Pinner.
func TestPinnerConformance(t *testing.T) {
	t.Run("cri-o", func(t *testing.T) {
		pintest.Run(t, func(t *testing.T) pintest.Subject {
			root := t.TempDir()
			d := crio.DropIn{MainConfig: filepath.Join(root, "crio.conf"), ConfigDir: filepath.Join(root, "crio.conf.d")}
			os.MkdirAll(d.ConfigDir, 0o755)
			rt := fakeruntime.New(d)
			rt.Registry[img(1)], rt.Registry[img(2)] = nil, nil
			return pintest.Subject{
				Name: "cri-o", Runtime: rt, Pinner: newNode(t, Config{}).Pinner(&crio.Pinner{DropIn: d, Live: rt, Reloader: rt}, noFiles{}),
				PinByHand: func(_ context.Context, ref string) error {
					return os.WriteFile(filepath.Join(d.ConfigDir, "10-admin.conf"), []byte(fmt.Sprintf("[crio.image]\npinned_images = [%q]\n", ref)), 0o644)
				},
				Available: [2]string{img(1), img(2)}, Missing: img(3),
			}
		})
	})
	t.Run("containerd", func(t *testing.T) {
		pintest.Run(t, func(t *testing.T) pintest.Subject {
			rt := fakeruntime.NewContainerd()
			rt.Registry[img(1)], rt.Registry[img(2)] = nil, nil
			p := newNode(t, Config{}).Pinner(&containerd.Pinner{Images: rt, Namespace: "k8s.io", Record: filepath.Join(t.TempDir(), "labels.json")}, noFiles{})
			// The agent follows containerd's events and pins records through these.
			if _, ok := p.(pin.Watcher); !ok || !pin.PinsRecords(p) {
				t.Fatal("containerd's pinner behind the mirror lost a capability")
			}
			return pintest.Subject{
				Name: "containerd", Runtime: rt, Pinner: p,
				PinByHand:    func(ctx context.Context, ref string) error { return rt.SetPinned(ctx, ref, true) },
				RepullUnpins: true,
				Available:    [2]string{img(1), img(2)}, Missing: img(3),
			}
		})
	})
}
