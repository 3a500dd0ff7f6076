package agent

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imagepin/imagepin/kubelet"
	"github.com/imagepin/imagepin/status"
)

func TestRegistryCondition(t *testing.T) {
	const a, b = "reg.example/team/a@sha256:1111111111111111111111111111111111111111111111111111111111111111",
		"reg.example/other/b@sha256:2222222222222222222222222222222222222222222222222222222222222222"
	refs := []string{a, b}
	ready := phaseOutcome{Phase: status.Ready, Reason: status.ReasonAllImagesPinned, Message: "2 images present and pinned"}
	verification := func(c kubelet.Config) kubelet.Verification {
		c.FeatureGates = map[string]bool{kubelet.FeatureGate: true}
		v, err := kubelet.NewVerification(c, kubelet.PullRecords{Enabled: true}, kubelet.Version{})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// No featureGates entry, no pull records yet, no version: the gate is not known.
	notStarted := func(policy string) kubelet.Verification {
		v, err := kubelet.NewVerification(kubelet.Config{ImagePullCredentialsVerificationPolicy: policy}, kubelet.PullRecords{}, kubelet.Version{})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	known := func(v kubelet.Verification) podStart { return podStart{v: v, known: true, ids: map[string]string{}} }
	// The kubelet's record of its pull of a (as image ID "id-a") cannot be read.
	root := t.TempDir()
	record := filepath.Join(root, "image_manager", "pulled", fmt.Sprintf("sha256-%x", sha256.Sum256([]byte("id-a"))))
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	broken, err := kubelet.ReadPullRecords(root)
	if err != nil {
		t.Fatal(err)
	}
	brokenRecord, err := kubelet.NewVerification(kubelet.Config{FeatureGates: map[string]bool{kubelet.FeatureGate: true}}, broken, kubelet.Version{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		o      phaseOutcome
		ps     podStart
		status string
		reason string
		msg    string
	}{
		{"not ready", phaseOutcome{Phase: status.Pulling, Message: "1/2 images ready"}, known(verification(kubelet.Config{})), status.False, status.ReasonNotReady, "1/2 images ready"},
		{"kubelet not read yet", ready, podStart{}, status.Unknown, status.ReasonCheckingKubelet, ""},
		{"kubelet config unreadable", ready, podStart{known: true, err: errors.New("kubelet drop-in /x.conf: no apiVersion/kind")}, status.Unknown, status.ReasonKubeletConfigUnreadable, "/x.conf"},
		{"default policy: pre-loaded", ready, known(verification(kubelet.Config{})), status.True, status.ReasonPodsStartWithoutRegistry, "NeverVerifyPreloadedImages: pods start from these 2 images"},
		{"a record the kubelet cannot read", ready, podStart{v: brokenRecord, known: true, ids: map[string]string{a: "id-a"}}, status.False, status.ReasonCredentialVerification,
			"1 of 2 images need the registry when a pod starts: " + a + " (the kubelet cannot read its pull record of it either (" + record},
		{"kubelet not started yet, its version not known: AlwaysVerify", ready, podStart{v: notStarted(kubelet.AlwaysVerify), known: true}, status.Unknown, status.ReasonCredentialVerification,
			"whether KubeletEnsureSecretPulledImages is on cannot be told"},
		{"kubelet not started yet, its version not known: default policy", ready, podStart{v: notStarted(""), known: true}, status.True, status.ReasonPodsStartWithoutRegistry,
			"whether KubeletEnsureSecretPulledImages is on or off"},
		{"AlwaysVerify", ready, known(verification(kubelet.Config{ImagePullCredentialsVerificationPolicy: kubelet.AlwaysVerify})), status.False, status.ReasonCredentialVerification, "AlwaysVerify: 2 of 2 images need the registry"},
		{"allowlist names the others", ready, known(verification(kubelet.Config{ImagePullCredentialsVerificationPolicy: kubelet.NeverVerifyAllowlistedImages,
			PreloadedImagesVerificationAllowlist: []string{"reg.example/team/*"}})), status.False, status.ReasonCredentialVerification, "1 of 2 images need the registry when a pod starts: " + b},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := registryCondition(c.o, c.ps, refs)
			if got.Type != status.ConditionRegistryIndependent || got.Status != c.status || got.Reason != c.reason || !strings.Contains(got.Message, c.msg) {
				t.Fatalf("got %s/%s %q; want %s/%s containing %q", got.Status, got.Reason, got.Message, c.status, c.reason, c.msg)
			}
		})
	}
}

// The agent reads the kubelet at start and again every VerifyEvery: a set Ready under
// AlwaysVerify is not RegistryIndependent, and becomes so when the policy changes.
func TestAgentSaysWhenPodStartsNeedTheRegistry(t *testing.T) {
	h := newHarness(t)
	h.cfg.VerifyEvery = 100 * time.Millisecond
	var mu sync.Mutex
	policy := kubelet.AlwaysVerify
	h.kubelet = func() (kubelet.Verification, error) {
		mu.Lock()
		defer mu.Unlock()
		return kubelet.NewVerification(kubelet.Config{ImagePullCredentialsVerificationPolicy: policy,
			FeatureGates: map[string]bool{kubelet.FeatureGate: true}}, kubelet.PullRecords{Enabled: true}, kubelet.Version{})
	}
	a, b := img("a", 1), img("b", 2)
	h.available(a, b)
	h.start()
	h.writeFile("upgrade.yaml", setDoc("upgrade", a, b))
	cond := func(want, reason string) func(status.Node) bool {
		return func(n status.Node) bool {
			s := n.Set("upgrade")
			if s == nil || s.Phase != status.Ready {
				return false
			}
			c := s.Condition(status.ConditionRegistryIndependent)
			return c != nil && c.Status == want && c.Reason == reason
		}
	}
	n := h.waitFor("Ready, needing the registry", cond(status.False, status.ReasonCredentialVerification))
	if c := n.Set("upgrade").Condition(status.ConditionRegistryIndependent); !strings.Contains(c.Message, "AlwaysVerify: 2 of 2 images") {
		t.Fatalf("message %q", c.Message)
	}
	mu.Lock()
	policy = kubelet.NeverVerify
	mu.Unlock()
	h.waitFor("RegistryIndependent after the policy changed", cond(status.True, status.ReasonPodsStartWithoutRegistry))
}
