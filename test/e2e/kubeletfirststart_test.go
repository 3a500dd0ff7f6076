//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/test/env"
)

// A node joining: imagepind pre-loads its set before the kubelet has ever started, so
// there are no pull records (image_manager) to tell whether the kubelet checks pull
// credentials. The kubelet's configuration says AlwaysVerify and the installed kubelet is
// 1.35.4, where the credential check is on by default: imagepind reads the binary's
// version and says pods would need the registry (never "registry-independent"), as does
// `imagepinctl check --registry-gone`. Then the kubelet starts with the registry gone and
// indeed starts none of the pods.
func TestRegistryGoneBeforeTheKubeletsFirstStart(t *testing.T) {
	p := newPodWorld(t, false)
	k, err := env.NewKubeletWith(p.kdir, p.socket(), env.KubeletOptions{
		GC:         env.KubeletGC{HighThresholdPercent: 90, LowThresholdPercent: 80, EvictionImagefsAvailable: "1Gi"},
		StaticPods: p.manifests, CredentialPolicy: kubelet.AlwaysVerify, RootDir: p.kroot,
	})
	if err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(env.CacheDir(), "kubelet")
	p.writeConfig(worldOptions{extra: fmt.Sprintf("[kubelet]\nconfig_dir = \"\"\nroot_dir = %q\nbinary = %q\n", p.kroot, binary),
		kubeletConfig: k.Config})
	p.startDaemon()
	p.writeSet("apps.yaml", alphaSet("apps", p.pause, p.teamA, p.teamB))
	p.waitFor("apps Ready", 120*time.Second, phaseIs("apps", status.Ready))
	p.requirePinned(p.pause, p.teamA, p.teamB)

	c := p.registryCondition(status.False, kubelet.AlwaysVerify)
	if c.Reason != status.ReasonCredentialVerification {
		t.Fatalf("before the kubelet's first start, under AlwaysVerify: %+v, want False/%s", c, status.ReasonCredentialVerification)
	}
	p.checkRegistryGone(1, "registry gone: NOT READY")

	// What the prediction was about: the kubelet starts for the first time with the
	// registry gone, and checks each pod's credentials at the registry.
	p.priv.Stop()
	p.writePods()
	if err := k.Start(nodeNameForKubelet); err != nil {
		t.Fatal(err)
	}
	p.kubelet = k
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log:\n%s", k.LogTail(60))
		}
		k.Stop()
	})
	// Each pinned image's pod is turned away by the kubelet's credential check, not for
	// want of the image: wait until the kubelet has tried both, then no pod may run.
	deadline := time.Now().Add(90 * time.Second)
	for {
		tried := 0
		for _, img := range []string{p.teamA, p.teamB} {
			for _, l := range k.Lines(img) {
				if strings.Contains(l, "Failed to pull image") || strings.Contains(l, "ErrImagePull") || strings.Contains(l, "Pulling image") {
					tried++
					break
				}
			}
		}
		if tried == 2 {
			break
		}
		if time.Now().After(deadline) || k.Exited() {
			t.Fatalf("the kubelet did not try the pinned images' pods (exited: %v):\n%s", k.Exited(), k.LogTail(40))
		}
		time.Sleep(250 * time.Millisecond)
	}
	p.logKubelet("AlwaysVerify, first start, registry gone", p.teamA, p.teamB)
	p.expectPods(nil, 10*time.Second)
}
