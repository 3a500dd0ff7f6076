package env

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Kubelet is a real kubelet (hack/kube-deps.sh: 1.36.3) against a CRI socket, with
// everything under Dir: standalone (no API server, static pods) or, with a kubeconfig,
// registered as a Node of a cluster.
type Kubelet struct {
	Dir     string
	Root    string // --root-dir
	Config  string // the KubeletConfiguration file
	LogFile string
	// Socket is the runtime's CRI socket: Stop removes the pods the kubelet started there.
	Socket string
	// Enter is a command prefix Start runs it under ("": none), e.g. nsenter into a
	// node's mount namespace (ClusterOptions.NodeNamespaces).
	Enter  []string
	args   []string // more flags (--kubeconfig, --node-labels, --v)
	cmd    *exec.Cmd
	exited chan struct{}
}

// The configuration's imageMinimumGCAge is 1s, not 0s: the kubelet's defaulting takes a
// zero duration for "unset" and makes it 2 minutes (seen in its log: minAge="2m0s").

// KubeletGC is the image garbage collection part of the kubelet's configuration.
type KubeletGC struct {
	HighThresholdPercent, LowThresholdPercent int
	// EvictionImagefsAvailable is evictionHard's imagefs.available ("1Gi" on a smaller imagefs): crossed, the
	// eviction manager reclaims node-level resources every 10 s, unused images first,
	// through the same image GC (pinned images skipped). The kubelet's own GC period is a
	// fixed 5 minutes; this is how a test sees a collection within seconds.
	EvictionImagefsAvailable string
}

// KubeletOptions is what a test sets in the kubelet's configuration besides its GC.
type KubeletOptions struct {
	GC KubeletGC
	// StaticPods, when set, is the directory of static pod manifests (staticPodPath).
	StaticPods string
	// CredentialPolicy is imagePullCredentialsVerificationPolicy ("": the kubelet's
	// default); Allowlist is preloadedImagesVerificationAllowlist.
	CredentialPolicy string
	Allowlist        []string
	FeatureGates     map[string]bool
	// RootDir is the kubelet's --root-dir (default Dir/root). A unix socket path is at
	// most 107 bytes and the kubelet listens on pod-resources/<n> under it: a deep test
	// directory makes the kubelet exit ("bind: invalid argument").
	RootDir string
	// Kubeconfig, when set, registers the kubelet with that API server as a Node
	// (--kubeconfig: a node client certificate); NodeLabels are its --node-labels and
	// RegisterWithTaints its startup taints (key=value:Effect, value optional).
	Kubeconfig         string
	NodeLabels         []string
	RegisterWithTaints []string
	// Verbosity is --v (default 5).
	Verbosity int
}

// NewKubelet writes the kubelet's configuration into dir; Start runs it.
func NewKubelet(dir, criSocket string, gc KubeletGC) (*Kubelet, error) {
	return NewKubeletWith(dir, criSocket, KubeletOptions{GC: gc})
}

// NewKubeletWith is NewKubelet with more of the configuration set.
func NewKubeletWith(dir, criSocket string, o KubeletOptions) (*Kubelet, error) {
	gc := o.GC
	if _, err := os.Stat(filepath.Join(CacheDir(), "kubelet")); err != nil {
		return nil, fmt.Errorf("%s/kubelet missing: run hack/kube-deps.sh", CacheDir())
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	healthz, err := FreePort()
	if err != nil {
		return nil, err
	}
	k := &Kubelet{Dir: dir, Root: o.RootDir, Config: filepath.Join(dir, "kubelet.yaml"), LogFile: filepath.Join(dir, "kubelet.log"), Socket: criSocket}
	if k.Root == "" {
		k.Root = filepath.Join(dir, "root")
	}
	k.args = []string{"--v", strconv.Itoa(cmp.Or(o.Verbosity, 5))}
	if o.Kubeconfig != "" {
		k.args = append(k.args, "--kubeconfig", o.Kubeconfig)
		if len(o.NodeLabels) > 0 {
			k.args = append(k.args, "--node-labels", strings.Join(o.NodeLabels, ","))
		}
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
imageMinimumGCAge: 1s
imageGCHighThresholdPercent: %d
imageGCLowThresholdPercent: %d
evictionHard:
  imagefs.available: %q
evictionPressureTransitionPeriod: 1s
syncFrequency: 1m
# The kubelet (1.35 on) refuses cgroup v1 (these machines) unless told not to.
failCgroupV1: false
`, port, healthz, criSocket, gc.HighThresholdPercent, gc.LowThresholdPercent, gc.EvictionImagefsAvailable)
	if o.StaticPods != "" {
		cfg += fmt.Sprintf("staticPodPath: %s\nfileCheckFrequency: 2s\n", o.StaticPods)
	} else {
		cfg += "fileCheckFrequency: 1h\n"
	}
	if o.CredentialPolicy != "" {
		cfg += "imagePullCredentialsVerificationPolicy: " + o.CredentialPolicy + "\n"
	}
	if len(o.Allowlist) > 0 {
		cfg += "preloadedImagesVerificationAllowlist:\n"
		for _, a := range o.Allowlist {
			cfg += fmt.Sprintf("- %q\n", a)
		}
	}
	if o.Kubeconfig != "" {
		// Several kubelets share this host: each its own pod log directory (a kubelet
		// removes the log directories of pods it does not know).
		cfg += fmt.Sprintf("podLogsDir: %s\n", filepath.Join(dir, "pods"))
	}
	if len(o.RegisterWithTaints) > 0 {
		cfg += "registerWithTaints:\n"
		for _, t := range o.RegisterWithTaints {
			kv, effect, ok := strings.Cut(t, ":")
			if !ok {
				return nil, fmt.Errorf("kubelet taint %q: want key[=value]:Effect", t)
			}
			key, value, _ := strings.Cut(kv, "=")
			cfg += fmt.Sprintf("- {key: %q, value: %q, effect: %q}\n", key, value, effect)
		}
	}
	if len(o.FeatureGates) > 0 {
		cfg += "featureGates:\n"
		for g, on := range o.FeatureGates {
			cfg += fmt.Sprintf("  %s: %v\n", g, on)
		}
	}
	if err := os.WriteFile(k.Config, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	return k, nil
}

// Start runs the kubelet; it keeps running until Stop.
func (k *Kubelet) Start(hostname string) error {
	logf, err := os.OpenFile(k.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append(slices.Clone(k.Enter), filepath.Join(CacheDir(), "kubelet"), "--config", k.Config,
		"--root-dir", k.RootDir(), "--hostname-override", hostname)
	args = append(args, k.args...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	k.cmd = cmd
	k.exited = make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(k.exited) }()
	return nil
}

// RootDir is the kubelet's --root-dir (its pull records are under image_manager/).
func (k *Kubelet) RootDir() string { return k.Root }

// Exited says whether the kubelet has stopped.
func (k *Kubelet) Exited() bool {
	select {
	case <-k.exited:
		return true
	default:
		return false
	}
}

// Stop stops the kubelet and removes the pods it started from its runtime (their
// conmon or shim processes would outlive the test otherwise); the runtime keeps running.
func (k *Kubelet) Stop() {
	stopProc(k.cmd, k.exited)
	k.cmd = nil
	if k.Socket != "" {
		RemovePods(k.Socket)
	}
	unmountUnder(k.Dir) // the kubelet mounts under its root dir
	unmountUnder(k.Root)
}

// Lines are the kubelet log's lines that contain every one of the strings.
func (k *Kubelet) Lines(contains ...string) []string {
	b, _ := os.ReadFile(k.LogFile)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		ok := true
		for _, c := range contains {
			ok = ok && strings.Contains(line, c)
		}
		if ok && line != "" {
			out = append(out, line)
		}
	}
	return out
}

// LogTail is the end of the kubelet's log.
func (k *Kubelet) LogTail(n int) string { return logTail(k.LogFile, n) }
