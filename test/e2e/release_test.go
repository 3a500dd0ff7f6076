//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/imagepin/imagepin/release/releasetest"
	"github.com/imagepin/imagepin/status"
)

// A set with spec.releaseImage: the node expands a multi payload (through the mirror of
// a disconnected cluster) and pins and pulls exactly what its role and OS stream need.
func TestReleaseImageSet(t *testing.T) {
	w := newMirrorWorld(t)
	p, err := releasetest.Push(t.Context(), releasetest.Options{PushHost: w.reg.Host, RefHost: "upstream.example.invalid", Repo: "ocp/release",
		Version: "4.20.1", Components: 4, Multi: true})
	if err != nil {
		t.Fatal(err)
	}
	var components []string
	for _, ref := range p.Components {
		components = append(components, ref)
	}
	w.startDaemon()
	doc := func(stream string) string {
		s := fmt.Sprintf("apiVersion: machineconfiguration.openshift.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: upgrade}\nspec:\n  releaseImage: %s\n", p.Release)
		if stream != "" {
			s += "  osImageStream: " + stream + "\n"
		}
		return s
	}
	check := func(what string, want []string, notWant ...string) {
		t.Helper()
		// Wait for these very images: a count alone matches the previous state too.
		var n status.Node
		waitUntil(t, what, 90*time.Second, func() bool {
			n = w.readStatus()
			s := n.Set("upgrade")
			if s == nil || s.Phase != status.Ready || s.ImagesTotal != len(want) {
				return false
			}
			for _, r := range want {
				if img := w.image(r); !img.Present || !img.Pinned {
					return false
				}
			}
			return true
		})
		s := n.Set("upgrade")
		if s.Release == nil || s.Release.Version != "4.20.1" || s.Release.Images != len(want) || s.Release.Image != p.Release {
			t.Fatalf("%s: release status %+v", what, s.Release)
		}
		w.requirePinned(want...)
		waitUntil(t, what+": exactly these pins", 30*time.Second, func() bool {
			live := w.livePins()
			slices.Sort(live)
			exp := slices.Clone(want)
			slices.Sort(exp)
			return slices.Equal(live, exp)
		})
		for _, r := range notWant {
			if img := w.image(r); img.Pinned {
				t.Fatalf("%s: %s is pinned", what, r)
			}
		}
	}
	// A worker: the components and the default stream's OS images.
	w.writeSet("upgrade.yaml", doc(""))
	check("worker, default stream", append(slices.Clone(components), p.OS["rhel-coreos"], p.OS["rhel-coreos-extensions"]),
		p.Release, p.OS["rhel-coreos-10"])
	if img := w.image(p.OS["rhel-coreos-10"]); img.Present {
		t.Fatal("another stream's OS image was pulled")
	}
	// The node becomes a control-plane node: the release image too.
	w.writeLabels(`{"node-role.kubernetes.io/master": ""}`)
	check("master, default stream", append(slices.Clone(components), p.OS["rhel-coreos"], p.OS["rhel-coreos-extensions"], p.Release))
	// Another stream.
	w.writeSet("upgrade.yaml", doc("rhel-10"))
	check("master, rhel-10", append(slices.Clone(components), p.OS["rhel-coreos-10"], p.OS["rhel-coreos-10-extensions"], p.Release))
}
