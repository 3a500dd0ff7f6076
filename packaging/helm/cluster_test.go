package helm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"
)

const (
	raw = "../aggregator" // the raw manifests (make manifests)
	api = "../../api/v1alpha1"
)

func sortedKeys(r rendered) []string { return slices.Sorted(maps.Keys(r.objects)) }

// chartLabels are the labels the chart puts on every object beside the object's own.
var chartLabels = []string{"app.kubernetes.io/part-of", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}

// readManifests decodes every object of a YAML file.
func readManifests(t *testing.T, file string) []object {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(o) > 0 {
			out = append(out, o)
		}
	}
	return out
}

// diff is the first path at which a and b differ ("" when equal).
func diff(a, b any, path string) string {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok {
			return path
		}
		for _, k := range slices.Sorted(maps.Keys(a)) {
			if d := diff(a[k], bm[k], path+"."+k); d != "" {
				return d
			}
		}
		for k := range bm {
			if _, ok := a[k]; !ok {
				return path + "." + k
			}
		}
		return ""
	case []any:
		bl, ok := b.([]any)
		if !ok || len(a) != len(bl) {
			return path
		}
		for i := range a {
			if d := diff(a[i], bl[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(a, b) {
			return path
		}
		return ""
	}
}

// withoutChartLabels is o without the labels the chart adds to every object.
func withoutChartLabels(o object) object {
	var c object
	b, _ := json.Marshal(o)
	json.Unmarshal(b, &c)
	if labels, ok := get(c, "metadata", "labels").(map[string]any); ok {
		for _, l := range chartLabels {
			delete(labels, l)
		}
		if len(labels) == 0 {
			delete(c["metadata"].(map[string]any), "labels")
		}
	}
	return c
}

// The chart and the raw manifests (packaging/aggregator, which make manifests ships and
// other tests hold to the binary's flags, the API server's admission plugin and the
// metrics the code exports) do not drift: rendered for OpenShift in namespace imagepin,
// the chart gives every raw object field for field, but for the labels it adds to all
// of its objects and the image it names. What the chart adds is listed.
func TestAggregatorObjectsMatchTheRawManifests(t *testing.T) {
	r := render(t, map[string]any{"distribution": "openshift", "aggregator": map[string]any{"tls": "openshift", "reportsNodePort": true}},
		monitoringAPIs...)
	seen := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(raw, "*.yaml"))
	if err != nil || len(files) < 8 {
		t.Fatalf("raw manifests: %v %v", files, err)
	}
	for _, file := range files {
		if filepath.Base(file) == "namespace.yaml" {
			continue // helm install --namespace (docs/install.md) makes it
		}
		for _, want := range readManifests(t, file) {
			k := key(want)
			got, ok := r.objects[k]
			if !ok {
				t.Errorf("%s: %s is not in the chart", file, k)
				continue
			}
			seen[k] = true
			got = withoutChartLabels(got)
			if str(got, "kind") == "Deployment" {
				c := get(got, "spec", "template", "spec", "containers", 0).(map[string]any)
				if c["image"] != "quay.io/imagepin/imagepin:0.1.0" || c["imagePullPolicy"] != "IfNotPresent" {
					t.Errorf("%s: image %v %v", k, c["image"], c["imagePullPolicy"])
				}
				c["image"] = "IMAGE"
				delete(c, "imagePullPolicy")
			}
			if d := diff(want, got, ""); d != "" {
				t.Errorf("%s: %s differs from the chart's at %s:\n raw   %v\n chart %v", file, k, d, pick(want, d), pick(got, d))
			}
		}
	}
	extra := []string{}
	for _, k := range sortedKeys(r) {
		if !seen[k] {
			extra = append(extra, k)
		}
	}
	wantExtra := []string{
		"ClusterRole /imagepin-uninstall", "ClusterRoleBinding /imagepin-uninstall",
		"ConfigMap imagepin/imagepind-config", "ConfigMap imagepin/kubelet-client-ca", "ConfigMap imagepin/kubelet-serving-ca",
		"CustomResourceDefinition /pinnedimagesets.imagepin.io", "DaemonSet imagepin/imagepind", "Job imagepin/imagepin-uninstall",
		"Role imagepin/imagepin-uninstall", "RoleBinding imagepin/imagepin-uninstall", "RoleBinding imagepin/imagepind-scc-privileged",
		"ServiceAccount imagepin/imagepin-uninstall", "ServiceAccount imagepin/imagepind", "ServiceMonitor imagepin/imagepin-aggregator",
	}
	if !slices.Equal(extra, wantExtra) {
		t.Errorf("the chart's own objects:\n got  %q\n want %q", extra, wantExtra)
	}
}

// pick is the value at a path diff gave (for the message).
func pick(o any, path string) any {
	for _, part := range strings.Split(strings.TrimPrefix(path, "."), ".") {
		name, idx, _ := strings.Cut(part, "[")
		if name != "" {
			o = get(o, name)
		}
		for idx != "" {
			var i int
			fmt.Sscanf(idx, "%d]", &i)
			o = get(o, i)
			_, idx, _ = strings.Cut(idx, "[")
		}
	}
	return o
}

// files/ holds the CRD and the alerting rules as the repository's sources hold them,
// byte for byte (Helm reads no file outside the chart).
func TestChartFilesAreTheSources(t *testing.T) {
	for copy, source := range map[string]string{
		"imagepin/files/pinnedimagesets.yaml": filepath.Join(api, "pinnedimagesets.yaml"),
		"imagepin/files/prometheusrule.yaml":  filepath.Join(raw, "prometheusrule.yaml"),
	} {
		a, err := os.ReadFile(copy)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(source)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s is not %s: cp %s %s", copy, source, source, copy)
		}
	}
	// The CRD rendered is the source's, kept on uninstall.
	crd := render(t, nil).get(t, "CustomResourceDefinition /pinnedimagesets.imagepin.io")
	if str(crd, "metadata", "annotations", "helm.sh/resource-policy") != "keep" {
		t.Errorf("the CRD is not kept on uninstall: %v", get(crd, "metadata", "annotations"))
	}
	want := readManifests(t, filepath.Join(api, "pinnedimagesets.yaml"))[0]
	got := withoutChartLabels(crd)
	delete(got["metadata"].(map[string]any), "annotations")
	if d := diff(want, got, ""); d != "" {
		t.Errorf("the rendered CRD differs from %s at %s", api, d)
	}
	if r := render(t, map[string]any{"crd": map[string]any{"install": false}}); slices.ContainsFunc(sortedKeys(r), func(k string) bool {
		return strings.HasPrefix(k, "CustomResourceDefinition")
	}) {
		t.Error("crd.install=false still renders the CRD")
	}
}

// The Prometheus Operator's objects are rendered only where their CRDs are served: on
// another cluster, an object of an unknown kind fails the whole install.
func TestMonitoringOnlyWithItsCRDs(t *testing.T) {
	kinds := func(r rendered) []string {
		var out []string
		for _, k := range sortedKeys(r) {
			if strings.HasPrefix(str(r.objects[k], "apiVersion"), "monitoring.coreos.com/") {
				out = append(out, k)
			}
		}
		return out
	}
	if got := kinds(render(t, nil)); len(got) != 0 {
		t.Errorf("without monitoring.coreos.com/v1: %v", got)
	}
	with := map[string]any{"imagepind": map[string]any{"metricsPort": 9777}, "monitoring": map[string]any{"labels": map[string]any{"release": "kps"}}}
	r := render(t, with, monitoringAPIs...)
	want := []string{"PodMonitor imagepin/imagepind", "PrometheusRule imagepin/imagepin", "ServiceMonitor imagepin/imagepin-aggregator"}
	if got := kinds(r); !slices.Equal(got, want) {
		t.Errorf("with monitoring.coreos.com/v1: %v, want %v", got, want)
	}
	for _, k := range want {
		if str(r.objects[k], "metadata", "labels", "release") != "kps" {
			t.Errorf("%s: monitoring.labels not on it: %v", k, get(r.objects[k], "metadata", "labels"))
		}
	}
	// Its rules are the source's.
	source := readManifests(t, filepath.Join(raw, "prometheusrule.yaml"))[0]
	if d := diff(get(source, "spec"), get(r.objects["PrometheusRule imagepin/imagepin"], "spec"), "spec"); d != "" {
		t.Errorf("the PrometheusRule's rules differ from the source's at %s", d)
	}
	// The aggregator's metrics port and imagepind's: the monitors name ports that exist.
	if str(r.objects["ServiceMonitor imagepin/imagepin-aggregator"], "spec", "endpoints", 0, "port") != "https-read" {
		t.Error("the ServiceMonitor does not scrape the Service's https-read port")
	}
	c := get(r.get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec", "containers", 0)
	if ports, _ := json.Marshal(get(c, "ports")); !strings.Contains(string(ports), `"name":"metrics"`) {
		t.Errorf("imagepind's ports %s: no metrics port for the PodMonitor", ports)
	}
	if !strings.Contains(str(r.get(t, "ConfigMap imagepin/imagepind-config"), "data", "imagepind.toml"), `address = ":9777"`) {
		t.Error("imagepind.metricsPort not in [metrics] address")
	}
	for _, off := range []map[string]any{
		{"monitoring": map[string]any{"prometheusRule": false, "serviceMonitor": false}, "imagepind": map[string]any{"metricsPort": 9777}},
		{"aggregator": map[string]any{"enabled": false}, "monitoring": map[string]any{"prometheusRule": false}},
	} {
		if got := kinds(render(t, off, monitoringAPIs...)); len(got) != 0 {
			t.Errorf("%v: %v", off, got)
		}
	}
}

// The ValidatingAdmissionPolicy that lets the aggregator change nothing of a Node but
// its startup taint goes with the aggregator, for its service account in the release's
// namespace and the startup taint of the values.
func TestNodePolicyGoesWithTheAggregator(t *testing.T) {
	r := render(t, nil)
	r.get(t, "ValidatingAdmissionPolicyBinding /imagepin-aggregator-nodes")
	p := r.get(t, "ValidatingAdmissionPolicy /imagepin-aggregator-nodes")
	if got := str(p, "spec", "matchConditions", 0, "expression"); got != "request.userInfo.username == 'system:serviceaccount:imagepin:imagepin-aggregator'" {
		t.Errorf("matchConditions: %s", got)
	}
	r, err := renderErr(t, map[string]any{"imagepind": map[string]any{"startupTaint": "example.com/held"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := str(r.get(t, "ValidatingAdmissionPolicy /imagepin-aggregator-nodes"), "spec", "variables", 0, "expression"); got != "'example.com/held'" {
		t.Errorf("the policy's key %s", got)
	}
	args, _ := json.Marshal(get(r.get(t, "Deployment imagepin/imagepin-aggregator"), "spec", "template", "spec", "containers", 0, "args"))
	if !strings.Contains(string(args), "--startup-taint=example.com/held") {
		t.Errorf("the aggregator's args %s", args)
	}
	hook, _ := json.Marshal(get(r.get(t, "Job imagepin/imagepin-uninstall"), "spec", "template", "spec", "containers", 0, "args"))
	if !strings.Contains(string(hook), "--startup-taint=example.com/held") {
		t.Errorf("the uninstall hook's args %s", hook)
	}
	r = render(t, map[string]any{"aggregator": map[string]any{"enabled": false}})
	for _, k := range sortedKeys(r) {
		if strings.Contains(k, "ValidatingAdmissionPolicy") {
			t.Errorf("%s without the aggregator", k)
		}
	}
}

// helm uninstall runs the hook before deleting anything: a Job of the chart's own image
// puts imagepind in uninstall mode on every node and waits for it. Its access is what it
// does and nothing more, and it is deleted once it succeeded (kept for a look when not).
func TestUninstallHook(t *testing.T) {
	r := render(t, map[string]any{"uninstall": map[string]any{"timeout": "9m"}})
	hooks := map[string]string{}
	for _, k := range sortedKeys(r) {
		if h := str(r.objects[k], "metadata", "annotations", "helm.sh/hook"); h != "" {
			hooks[k] = h
			if p := str(r.objects[k], "metadata", "annotations", "helm.sh/hook-delete-policy"); p != "before-hook-creation,hook-succeeded" {
				t.Errorf("%s: hook-delete-policy %q", k, p)
			}
		}
	}
	want := []string{"ClusterRole /imagepin-uninstall", "ClusterRoleBinding /imagepin-uninstall", "Job imagepin/imagepin-uninstall",
		"Role imagepin/imagepin-uninstall", "RoleBinding imagepin/imagepin-uninstall", "ServiceAccount imagepin/imagepin-uninstall"}
	if got := slices.Sorted(maps.Keys(hooks)); !slices.Equal(got, want) {
		t.Errorf("hooks %v, want %v", got, want)
	}
	for k, h := range hooks {
		if h != "pre-delete" {
			t.Errorf("%s: hook %q", k, h)
		}
		if w := str(r.objects[k], "metadata", "annotations", "helm.sh/hook-weight"); (k == "Job imagepin/imagepin-uninstall") != (w == "0") {
			t.Errorf("%s: weight %q: the RBAC before the Job", k, w)
		}
	}
	rules := func(k string) string {
		b, _ := json.Marshal(get(r.get(t, k), "rules"))
		return string(b)
	}
	if got := rules("Role imagepin/imagepin-uninstall"); got != `[{"apiGroups":["apps"],"resourceNames":["imagepind"],"resources":["daemonsets"],"verbs":["get","patch"]},{"apiGroups":[""],"resources":["pods"],"verbs":["list"]}]` {
		t.Errorf("Role: %s", got)
	}
	if got := rules("ClusterRole /imagepin-uninstall"); got != `[{"apiGroups":[""],"resources":["nodes"],"verbs":["get","list","patch"]},{"apiGroups":[""],"resources":["nodes/status"],"verbs":["patch"]}]` {
		t.Errorf("ClusterRole: %s", got)
	}
	job := r.get(t, "Job imagepin/imagepin-uninstall")
	c := get(job, "spec", "template", "spec", "containers", 0)
	if str(c, "image") != str(r.get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec", "containers", 0, "image") {
		t.Errorf("the hook's image %s is not imagepind's", str(c, "image"))
	}
	args := map[string]string{}
	for _, a := range get(c, "args").([]any) {
		k, v, _ := strings.Cut(a.(string), "=")
		args[k] = v
	}
	var command, ready []string
	if err := json.Unmarshal([]byte(args["--command"]), &command); err != nil {
		t.Fatalf("--command %q: %v", args["--command"], err)
	}
	if err := json.Unmarshal([]byte(args["--ready"]), &ready); err != nil {
		t.Fatalf("--ready %q: %v", args["--ready"], err)
	}
	if str(c, "command", 0) != "/usr/bin/imagepinctl" || args["uninstall-nodes"] != "" || args["--daemonset"] != "imagepind" || args["--namespace"] != "imagepin" ||
		args["--container"] != "imagepind" || args["--timeout"] != "9m" ||
		!slices.Equal(command, []string{"/usr/bin/imagepind", "uninstall", "--wait", "--config=/etc/imagepin/imagepind.toml"}) ||
		!slices.Equal(ready, []string{"/usr/bin/imagepind", "uninstall", "--status", "--config=/etc/imagepin/imagepind.toml"}) {
		t.Errorf("the hook's command %v %v", get(c, "command"), args)
	}
	if r := render(t, map[string]any{"uninstall": map[string]any{"enabled": false}}); slices.ContainsFunc(sortedKeys(r), func(k string) bool {
		return strings.Contains(k, "uninstall")
	}) {
		t.Error("uninstall.enabled=false still renders the hook")
	}
}

// helm lint for every preset: no warning (what `helm lint --strict` fails on) and no
// error.
func TestLint(t *testing.T) {
	for _, p := range presets {
		l := lint.All(chartDir, values(p.values()), namespace, false)
		for _, m := range l.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("%s: helm lint: %s", p, m)
			}
		}
	}
}

// Bad values are refused with an error naming the value.
func TestBadValuesAreRefused(t *testing.T) {
	for _, c := range []struct {
		over map[string]any
		want string
	}{
		{map[string]any{"runtime": "docker"}, "runtime"},
		{map[string]any{"distribution": "eks"}, "distribution"},
		{map[string]any{"runtime": "containerd", "distribution": "openshift"}, "runtime: openshift nodes run crio"},
		{map[string]any{"paths": map[string]any{"kubeletKubconfig": "/x"}}, "kubeletKubconfig"},
		{map[string]any{"paths": map[string]any{"criSocket": "run/crio/crio.sock"}}, "criSocket"},
		{map[string]any{"image": map[string]any{"digest": "sha256:abc"}}, "digest"},
		{map[string]any{"imagepind": map[string]any{"crioReload": "dbus"}}, "crioReload"},
		{map[string]any{"aggregator": map[string]any{"tls": "self"}}, "tls"},
		{map[string]any{"uninstall": map[string]any{"timeout": "soon"}}, "timeout"},
		{map[string]any{"nodeIdentity": map[string]any{"clientCA": ""}}, "nodeIdentity.clientCA"},
		{map[string]any{"nodeIdentity": map[string]any{"servingCA": ""}}, "nodeIdentity.servingCA"},
	} {
		_, err := renderErr(t, c.over)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.over, err, c.want)
		}
	}
}

// imagepind verifies the aggregator with the CA of the aggregator.tls mode, whichever
// issues it; the chart makes a certificate only in generate mode.
func TestAggregatorCAPerTLSMode(t *testing.T) {
	for mode, want := range map[string]string{
		"generate":  `{"configMap":{"name":"imagepin-aggregator-ca"},"name":"aggregator-ca"}`,
		"openshift": `{"configMap":{"items":[{"key":"service-ca.crt","path":"ca.crt"}],"name":"openshift-service-ca.crt"},"name":"aggregator-ca"}`,
		"secret":    `{"name":"aggregator-ca","secret":{"items":[{"key":"ca.crt","path":"ca.crt"}],"secretName":"imagepin-aggregator-tls"}}`,
	} {
		r := render(t, map[string]any{"aggregator": map[string]any{"tls": mode}}, monitoringAPIs...)
		var got string
		for _, v := range get(r.get(t, "DaemonSet imagepin/imagepind"), "spec", "template", "spec", "volumes").([]any) {
			if str(v, "name") == "aggregator-ca" {
				b, _ := json.Marshal(v)
				got = string(b)
			}
		}
		if got != want {
			t.Errorf("%s: the aggregator's CA %s, want %s", mode, got, want)
		}
		_, made := r.objects["Secret imagepin/imagepin-aggregator-tls"]
		if made != (mode == "generate") {
			t.Errorf("%s: the chart made the Secret: %v", mode, made)
		}
		sm, _ := json.Marshal(get(r.get(t, "ServiceMonitor imagepin/imagepin-aggregator"), "spec", "endpoints", 0, "tlsConfig", "ca"))
		if !strings.Contains(string(sm), map[string]string{"generate": "imagepin-aggregator-ca", "openshift": "openshift-service-ca.crt", "secret": "imagepin-aggregator-tls"}[mode]) {
			t.Errorf("%s: the ServiceMonitor's CA %s", mode, sm)
		}
	}
}
