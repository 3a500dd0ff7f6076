package helm_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/ from what the chart renders")

// preset is one (runtime, distribution) the chart knows.
type preset struct{ runtime, distribution string }

func (p preset) String() string { return p.runtime + "-" + p.distribution }

func (p preset) values() map[string]any {
	return map[string]any{"runtime": p.runtime, "distribution": p.distribution}
}

var presets = []preset{
	{"crio", "generic"}, {"containerd", "generic"}, {"containerd", "k3s"}, {"containerd", "rke2"},
	{"crio", "k3s"}, {"crio", "rke2"}, {"crio", "openshift"},
}

// hostPath is a host path the DaemonSet mounts: its hostPath type and whether it is
// mounted read-only.
type hostPath struct {
	typ string
	ro  bool
}

func (h hostPath) String() string {
	if h.ro {
		return h.typ + " ro"
	}
	return h.typ + " rw"
}

// hostPaths are the DaemonSet's host paths, each mounted at the same path in the
// container (imagepind.toml names the host's paths).
func hostPaths(t *testing.T, r rendered) map[string]hostPath {
	t.Helper()
	spec := get(r.get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec")
	byName := map[string]string{}
	out := map[string]hostPath{}
	for _, v := range get(spec, "volumes").([]any) {
		if p := str(v, "hostPath", "path"); p != "" {
			byName[str(v, "name")] = p
			out[p] = hostPath{typ: str(v, "hostPath", "type")}
		}
	}
	mounted := map[string]bool{}
	for _, m := range get(spec, "containers", 0, "volumeMounts").([]any) {
		p, ok := byName[str(m, "name")]
		if !ok {
			continue
		}
		if str(m, "mountPath") != p {
			t.Errorf("volume %s: host path %s mounted at %s: imagepind.toml names the host's paths", str(m, "name"), p, str(m, "mountPath"))
		}
		h := out[p]
		h.ro, _ = get(m, "readOnly").(bool)
		out[p] = h
		mounted[p] = true
	}
	for p := range out {
		if !mounted[p] {
			t.Errorf("host path %s is a volume nothing mounts", p)
		}
	}
	return out
}

// Each preset mounts what imagepind reads and writes on that kind of node, and nothing
// more: the runtime's socket (its directory), the runtime's registry configuration
// (read-write: the pins' drop-in, the mirror's drop-in or hosts.toml blocks, the tag
// endpoint's CA), D-Bus for CRI-O's reload, the kubelet's certificates, kubeconfig,
// config and pull records (read-only), and imagepind's own state.
func TestPresetsMountWhatTheNodeNeeds(t *testing.T) {
	const (
		dir   = "Directory"
		orNew = "DirectoryOrCreate"
		file  = "File"
	)
	rw := func(typ string) hostPath { return hostPath{typ: typ} }
	ro := func(typ string) hostPath { return hostPath{typ: typ, ro: true} }
	// The runtime's image filesystem (CRI ImageFsInfo's mountpoint, the disk check's).
	crio := map[string]hostPath{
		"/run/crio": ro(dir), "/etc/crio": rw(dir), "/etc/containers": rw(dir), "/run/dbus": ro(dir),
		"/var/lib/containers/storage/overlay-images": ro(dir),
	}
	generic := map[string]hostPath{
		"/var/lib/kubelet/pki": ro(dir), "/etc/kubernetes/kubelet.conf": ro(file), "/var/lib/kubelet/config.yaml": ro(file),
	}
	rancher := func(d string) map[string]hostPath {
		// The agent's directory holds the kubelet's kubeconfig, certificates and keys
		// (client-kubelet.crt and .key, serving-kubelet.crt and .key) and its config
		// drop-ins, and containerd's image filesystem: one read-only mount.
		return map[string]hostPath{"/var/lib/rancher/" + d + "/agent": ro(dir)}
	}
	join := func(ms ...map[string]hostPath) map[string]hostPath {
		out := map[string]hostPath{
			"/var/lib/imagepin": rw(orNew), "/var/lib/kubelet/image_manager": ro(orNew),
		}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	want := map[preset]map[string]hostPath{
		{"crio", "generic"}: join(crio, generic),
		{"containerd", "generic"}: join(generic, map[string]hostPath{
			"/run/containerd": ro(dir), "/etc/containerd/certs.d": rw(dir),
			"/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs": ro(dir)}),
		{"containerd", "k3s"}: join(rancher("k3s"), map[string]hostPath{
			"/run/k3s/containerd": ro(dir), "/var/lib/rancher/k3s/agent/etc/containerd/certs.d": rw(dir)}),
		{"containerd", "rke2"}: join(rancher("rke2"), map[string]hostPath{
			"/run/k3s/containerd": ro(dir), "/var/lib/rancher/rke2/agent/etc/containerd/certs.d": rw(dir)}),
		{"crio", "k3s"}:  join(crio, rancher("k3s")),
		{"crio", "rke2"}: join(crio, rancher("rke2")),
		{"crio", "openshift"}: join(crio, map[string]hostPath{
			"/var/lib/kubelet/pki": ro(dir), "/var/lib/kubelet/kubeconfig": ro(file),
			"/etc/kubernetes/kubelet.conf": ro(file), "/var/lib/kubelet/config.json": ro(file)}),
	}
	// The node's CA certificates (the image has none): RHCOS's in /etc/pki, the others'
	// in /etc/ssl/certs.
	for p, m := range want {
		if p.distribution == "openshift" {
			m["/etc/pki"] = ro(dir)
		} else {
			m["/etc/ssl/certs"] = ro(dir)
		}
	}
	for _, p := range presets {
		t.Run(p.String(), func(t *testing.T) {
			got := hostPaths(t, render(t, p.values()))
			for path, w := range want[p] {
				if g, ok := got[path]; !ok {
					t.Errorf("%s: not mounted, want %s", path, w)
				} else if g != w {
					t.Errorf("%s: %s, want %s", path, g, w)
				}
			}
			for path, g := range got {
				if _, ok := want[p][path]; !ok {
					t.Errorf("%s: mounted (%s), and no preset of %s needs it", path, g, p)
				}
			}
		})
	}
	// A path replaced in values is mounted instead of the preset's.
	got := hostPaths(t, render(t, map[string]any{"runtime": "containerd", "paths": map[string]any{
		"containerdConfigPath": "/etc/containerd/registries", "kubeletConfig": "-"}}))
	if _, ok := got["/etc/containerd/registries"]; !ok {
		t.Errorf("paths.containerdConfigPath not mounted: %v", got)
	}
	if _, ok := got["/etc/containerd/certs.d"]; ok {
		t.Errorf("the preset's config_path still mounted: %v", got)
	}
	if _, ok := got["/var/lib/kubelet/config.yaml"]; ok {
		t.Errorf("paths.kubeletConfig \"-\" still mounted: %v", got)
	}
}

// What a rolling update (helm upgrade to a new image), an eviction or a kill does to a
// node is a restart of imagepind, which keeps every pin (its SIGTERM returns without
// touching the runtime: cmd/imagepind's errgroup ends, agent.Run returns on ctx.Done).
// The DaemonSet must give it no way to do more: imagepind in its normal mode, no hook
// that runs anything at stop, one pod a node at a time (maxSurge 0: the state lock and
// the host ports), scheduled whatever the node's taints (its own startup taint included),
// at system-node-critical priority.
func TestDaemonSetNeverUnpins(t *testing.T) {
	for _, p := range presets {
		t.Run(p.String(), func(t *testing.T) {
			ds := render(t, p.values()).get(t, "DaemonSet imagepin/imagepind")
			if s := get(ds, "spec", "updateStrategy"); str(s, "type") != "RollingUpdate" ||
				fmt.Sprint(get(s, "rollingUpdate", "maxSurge")) != "0" || fmt.Sprint(get(s, "rollingUpdate", "maxUnavailable")) != "1" {
				t.Errorf("updateStrategy %v: want RollingUpdate, maxSurge 0, maxUnavailable 1", s)
			}
			spec := get(ds, "spec", "template", "spec")
			tol, _ := json.Marshal(get(spec, "tolerations"))
			if string(tol) != `[{"operator":"Exists"}]` {
				t.Errorf("tolerations %s: want every taint tolerated", tol)
			}
			if str(spec, "priorityClassName") != "system-node-critical" {
				t.Errorf("priorityClassName %q", str(spec, "priorityClassName"))
			}
			if get(spec, "hostNetwork") != true || str(spec, "dnsPolicy") != "ClusterFirstWithHostNet" {
				t.Errorf("hostNetwork %v, dnsPolicy %q: the mirror is on the host's loopback, the aggregator by its Service name",
					get(spec, "hostNetwork"), str(spec, "dnsPolicy"))
			}
			if g := get(spec, "terminationGracePeriodSeconds"); fmt.Sprint(g) != "30" {
				t.Errorf("terminationGracePeriodSeconds %v", g)
			}
			containers := get(spec, "containers").([]any)
			if len(containers) != 1 || get(spec, "initContainers") != nil {
				t.Fatalf("containers %d, initContainers %v: want imagepind alone", len(containers), get(spec, "initContainers"))
			}
			c := containers[0]
			cmd, _ := json.Marshal([]any{get(c, "command"), get(c, "args")})
			if strings.Contains(string(cmd), "uninstall") || str(c, "command", 0) != "/usr/bin/imagepind" {
				t.Errorf("command %s: want imagepind in its normal mode", cmd)
			}
			if get(c, "lifecycle") != nil || get(c, "readinessProbe") != nil {
				t.Errorf("lifecycle %v, readinessProbe %v: nothing runs at stop", get(c, "lifecycle"), get(c, "readinessProbe"))
			}
			if get(c, "securityContext", "privileged") != false || get(c, "securityContext", "allowPrivilegeEscalation") != false {
				t.Errorf("securityContext %v: not privileged", get(c, "securityContext"))
			}
			if caps, _ := json.Marshal(get(c, "securityContext", "capabilities")); string(caps) != `{"drop":["ALL"]}` {
				t.Errorf("capabilities %s: none needed", caps)
			}
			if get(spec, "hostPID") != nil {
				t.Errorf("hostPID %v with CRI-O's reload over D-Bus", get(spec, "hostPID"))
			}
		})
	}
	// crioReload signal: SIGHUP to CRI-O's PID (SO_PEERCRED on its socket), which only
	// the host's PID namespace sees; no D-Bus then.
	r := render(t, map[string]any{"imagepind": map[string]any{"crioReload": "signal"}})
	spec := get(r.get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec")
	if get(spec, "hostPID") != true {
		t.Errorf("crioReload signal: hostPID %v", get(spec, "hostPID"))
	}
	if _, ok := hostPaths(t, r)["/run/dbus"]; ok {
		t.Error("crioReload signal: D-Bus still mounted")
	}
}

// The config each preset writes, as testdata/imagepind-<preset>.toml holds it (`go test
// -update` rewrites them). The main module's conf tests load every one of them as
// imagepind does, with a node's --node-name and --peer-host.
func TestImagepindConfigPerPreset(t *testing.T) {
	for _, p := range presets {
		t.Run(p.String(), func(t *testing.T) {
			got := str(render(t, p.values()).get(t, "ConfigMap imagepin/imagepind-config"), "data", "imagepind.toml")
			file := filepath.Join("testdata", "imagepind-"+p.String()+".toml")
			if *update {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("%s differs from what the chart renders (go test -update rewrites it):\n%s", file, got)
			}
		})
	}
	// Keys of imagepind.config go over the chart's, false and 0 included; integers stay
	// integers (imagepind refuses 16.0 for an integer key).
	got := str(render(t, map[string]any{"imagepind": map[string]any{"config": map[string]any{
		"unpin_delay": "10m", "cri": map[string]any{"pull_concurrency": 16}, "disk": map[string]any{"uncompressed_sizes": false},
		"peers": map[string]any{"serve_mib_per_second": 0}}}}).get(t, "ConfigMap imagepin/imagepind-config"), "data", "imagepind.toml")
	for _, want := range []string{`unpin_delay = "10m"`, "pull_concurrency = 16\n", "uncompressed_sizes = false", "serve_mib_per_second = 0\n",
		`endpoint = "unix:///run/crio/crio.sock"`} {
		if !strings.Contains(got, want) {
			t.Errorf("imagepind.config: no %q in\n%s", want, got)
		}
	}
}

// A changed config rolls the pods: the pod template carries its checksum.
func TestConfigChangeRollsThePods(t *testing.T) {
	sum := func(over map[string]any) string {
		return str(render(t, over).get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "metadata", "annotations", "checksum/config")
	}
	a, b := sum(nil), sum(map[string]any{"imagepind": map[string]any{"config": map[string]any{"unpin_delay": "5m"}}})
	if a == "" || a == b {
		t.Fatalf("checksum/config %q then %q", a, b)
	}
	if c := sum(map[string]any{"image": map[string]any{"tag": "0.2.0"}}); c != a {
		t.Errorf("a new image changed the config's checksum: %q, %q", a, c)
	}
}

// Without sharing, no peer port and no CA is needed; the node-local mirror stays.
func TestWithoutSharing(t *testing.T) {
	r := render(t, map[string]any{"peers": map[string]any{"share": false}, "aggregator": map[string]any{"enabled": false},
		"nodeIdentity": map[string]any{"clientCA": "", "servingCA": ""}})
	c := get(r.get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec", "containers", 0)
	args, _ := json.Marshal(get(c, "args"))
	if strings.Contains(string(args), "--peer-host") || get(c, "ports") != nil {
		t.Errorf("args %s, ports %v: no peers", args, get(c, "ports"))
	}
	toml := str(r.get(t, "ConfigMap imagepin/imagepind-config"), "data", "imagepind.toml")
	if !strings.Contains(toml, "enabled = true") || strings.Contains(toml, "address") {
		t.Errorf("the mirror alone:\n%s", toml)
	}
	for k := range r.objects {
		if strings.Contains(k, "kubelet-") || strings.Contains(k, "aggregator") {
			t.Errorf("%s rendered without sharing or an aggregator", k)
		}
	}
	if !slices.Contains(sortedKeys(r), "ClusterRole /imagepin-node") {
		t.Error("the nodes' read access to PinnedImageSets goes with the aggregator")
	}
}

// imagepind.nodeSelector puts the DaemonSet on one runtime's nodes (a mixed-runtime
// cluster: one release per runtime at a time, docs/install.md); it keeps tolerating every
// taint. Nothing selects by default. A selector's value that is not a string is refused
// by the schema, naming it (the API would refuse the DaemonSet at install).
func TestNodeSelectorPicksTheRuntimesNodes(t *testing.T) {
	spec := get(render(t, nil).get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec")
	if s := get(spec, "nodeSelector"); s != nil {
		t.Errorf("default nodeSelector %v, want none: every node", s)
	}
	r := render(t, map[string]any{"runtime": "containerd", "distribution": "k3s",
		"imagepind": map[string]any{"nodeSelector": map[string]any{"example.com/runtime": "containerd"}}})
	spec = get(r.get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec")
	if got, _ := json.Marshal(get(spec, "nodeSelector")); string(got) != `{"example.com/runtime":"containerd"}` {
		t.Errorf("nodeSelector %s", got)
	}
	if got, _ := json.Marshal(get(spec, "tolerations")); string(got) != `[{"operator":"Exists"}]` {
		t.Errorf("tolerations with a nodeSelector: %s", got)
	}
	_, err := renderErr(t, map[string]any{"imagepind": map[string]any{"nodeSelector": map[string]any{"example.com/runtime": true}}})
	if err == nil || !strings.Contains(err.Error(), "nodeSelector") {
		t.Errorf("a nodeSelector value true: %v, want refused naming imagepind.nodeSelector", err)
	}
}
