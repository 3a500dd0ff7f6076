package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/imagepin/imagepin/cluster/aggregator"
)

type manifest map[string]any

func (m manifest) get(path ...string) any {
	var cur any = map[string]any(m)
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

func load(t *testing.T, name string) manifest { return loadAll(t, name)[0] }

// loadAll reads every document of a manifest file.
func loadAll(t *testing.T, name string) []manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../packaging/aggregator", name))
	if err != nil {
		t.Fatal(err)
	}
	var out []manifest
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var m manifest
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if m != nil {
			out = append(out, m)
		}
	}
	return out
}

// The aggregator's manifests parse and reference what the binary expects: its flags, the
// files behind them, its ports, its health endpoint.
func TestManifestsMatchTheBinary(t *testing.T) {
	ns := load(t, "namespace.yaml")
	dep := load(t, "deployment.yaml")
	svc := load(t, "service.yaml")
	if ns.get("kind") != "Namespace" || dep.get("kind") != "Deployment" || svc.get("kind") != "Service" {
		t.Fatal("kinds")
	}
	name := ns.get("metadata", "name")
	if dep.get("metadata", "namespace") != name || svc.get("metadata", "namespace") != name {
		t.Fatal("namespaces differ")
	}
	c := dep.get("spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	if c["image"] != "IMAGE" {
		t.Fatalf("the image placeholder make manifests replaces: %v", c["image"])
	}
	var args []string
	for _, a := range c["args"].([]any) {
		args = append(args, a.(string))
	}
	// The binary's own flag set accepts every argument.
	var o options
	fs := flag.NewFlagSet("imagepin-aggregator", flag.ContinueOnError)
	defineFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("deployment args: %v", err)
	}
	// Every file the flags name is under a mounted volume.
	mounts := map[string]string{}
	for _, m := range c["volumeMounts"].([]any) {
		mm := m.(map[string]any)
		mounts[mm["mountPath"].(string)] = mm["name"].(string)
	}
	for _, f := range []string{o.tlsCert, o.tlsKey, o.clientCA, o.stateFile} {
		if _, ok := mounts[filepath.Dir(f)]; !ok {
			t.Errorf("%s is not under a mounted volume", f)
		}
	}
	volumes := map[string]map[string]any{}
	for _, v := range dep.get("spec", "template", "spec", "volumes").([]any) {
		vm := v.(map[string]any)
		volumes[vm["name"].(string)] = vm
	}
	tlsVol := volumes[mounts[filepath.Dir(o.tlsCert)]]
	secret, _ := tlsVol["secret"].(map[string]any)
	if secret == nil || secret["secretName"] != svc.get("metadata", "annotations").(map[string]any)["service.beta.openshift.io/serving-cert-secret-name"] {
		t.Fatalf("the TLS volume must be the service CA's serving-cert secret: %v", tlsVol)
	}
	if filepath.Base(o.tlsCert) != "tls.crt" || filepath.Base(o.tlsKey) != "tls.key" {
		t.Fatal("the service CA writes tls.crt and tls.key")
	}
	if cm, _ := volumes[mounts[filepath.Dir(o.clientCA)]]["configMap"].(map[string]any); cm == nil || filepath.Base(o.clientCA) != "ca-bundle.crt" {
		t.Fatalf("the kubelet client CA comes from a ConfigMap with ca-bundle.crt: %v", o.clientCA)
	}
	// Ports: the container's named ports are the listeners; the Service targets them.
	ports := map[string]string{}
	for _, p := range c["ports"].([]any) {
		pm := p.(map[string]any)
		ports[pm["name"].(string)] = yamlNum(pm["containerPort"])
	}
	for flagAddr, portName := range map[string]string{o.grpcAddress: "grpc-reports", o.httpAddress: "http-read"} {
		_, port, _ := net.SplitHostPort(flagAddr)
		if ports[portName] != port {
			t.Errorf("%s: container port %s, flag %s", portName, ports[portName], flagAddr)
		}
	}
	// The read port is reached from inside the cluster only: no Service puts it on the
	// nodes' addresses; the reports' NodePort carries the report port alone.
	services := loadAll(t, "service.yaml")
	nodePorts := 0
	for _, sv := range services {
		if sv.get("metadata", "namespace") != name {
			t.Errorf("service %v: namespace", sv.get("metadata", "name"))
		}
		for _, p := range sv.get("spec", "ports").([]any) {
			tp := p.(map[string]any)["targetPort"].(string)
			if ports[tp] == "" {
				t.Errorf("the service targets %s, not a container port", tp)
			}
			if sv.get("spec", "type") == "NodePort" {
				nodePorts++
				if tp != "grpc-reports" {
					t.Errorf("service %v exposes %s on every node", sv.get("metadata", "name"), tp)
				}
			}
		}
	}
	if len(services) != 2 || nodePorts != 1 || svc.get("spec", "type") != "ClusterIP" {
		t.Errorf("want a ClusterIP service with both ports and a NodePort service for reports: %d services, %d node ports", len(services), nodePorts)
	}
	np := load(t, "networkpolicy.yaml")
	for k, v := range np.get("spec", "podSelector", "matchLabels").(map[string]any) {
		if dep.get("spec", "template", "metadata", "labels").(map[string]any)[k] != v {
			t.Errorf("the NetworkPolicy selects %s=%v, not the pods", k, v)
		}
	}
	sel := svc.get("spec", "selector").(map[string]any)
	labels := dep.get("spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("the service selector %s=%v does not match the pods", k, v)
		}
	}
	// The probes ask the read listener; liveness always answers, readiness only on the
	// leader (so the Service sends reports to one replica).
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		get := c[probe].(map[string]any)["httpGet"].(map[string]any)
		if get["port"] != "http-read" || get["scheme"] != "HTTPS" {
			t.Errorf("%s port %v scheme %v: the read side serves HTTPS", probe, get["port"], get["scheme"])
		}
		for _, leading := range []bool{false, true} {
			srv := httptest.NewServer(aggregator.ReadHandler(aggregator.NewStore(aggregator.DefaultLimits(), time.Now), func() bool { return leading }))
			resp, err := http.Get(srv.URL + get["path"].(string))
			srv.Close()
			want := 200
			if probe == "readinessProbe" && !leading {
				want = 503
			}
			if err != nil || resp.StatusCode != want {
				t.Errorf("%s %v leading=%v: %v %v, want %d", probe, get["path"], leading, err, resp, want)
			}
		}
	}
	// Two replicas with leader election, under the service account the RBAC binds.
	if yamlNum(dep.get("spec", "replicas")) != "2" || !o.cluster || !o.leaderElect {
		t.Errorf("replicas %v cluster=%v leader-elect=%v", dep.get("spec", "replicas"), o.cluster, o.leaderElect)
	}
	sa := dep.get("spec", "template", "spec", "serviceAccountName")
	rbac, err := os.ReadFile("../../packaging/aggregator/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if sa != "imagepin-aggregator" || !strings.Contains(string(rbac), "kind: ServiceAccount\nmetadata:\n  name: imagepin-aggregator\n  namespace: imagepin") {
		t.Errorf("service account %v is not the one rbac.yaml binds", sa)
	}
	// The read side's TokenReviews and SubjectAccessReviews need system:auth-delegator.
	delegated := false
	for _, m := range loadAll(t, "rbac.yaml") {
		if m.get("kind") == "ClusterRoleBinding" && m.get("roleRef", "name") == "system:auth-delegator" {
			sub := m.get("subjects").([]any)[0].(map[string]any)
			delegated = sub["name"] == sa && sub["namespace"] == name
		}
	}
	if !delegated {
		t.Error("rbac.yaml does not bind the aggregator's service account to system:auth-delegator")
	}
	pdb := load(t, "pdb.yaml")
	for k, v := range pdb.get("spec", "selector", "matchLabels").(map[string]any) {
		if labels[k] != v {
			t.Errorf("the PodDisruptionBudget selector %s=%v does not match the pods", k, v)
		}
	}
	// The container build's entrypoint and ports.
	cf, err := os.ReadFile("../../packaging/aggregator/Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`ENTRYPOINT ["/usr/bin/imagepin-aggregator"]`, "EXPOSE 9443 9444", "./cmd/imagepin-aggregator", "CGO_ENABLED=0"} {
		if !strings.Contains(string(cf), want) {
			t.Errorf("Containerfile lacks %s", want)
		}
	}
}

// yamlNum is a YAML number as text (sigs.k8s.io/yaml decodes numbers as float64).
func yamlNum(v any) string {
	if n, ok := v.(float64); ok {
		return strconv.FormatFloat(n, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}
