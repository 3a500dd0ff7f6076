// Package helm_test renders the imagepin chart with Helm's own engine (helm.sh/helm/v3,
// the version helm 3.22 is built from) and checks what it gives each preset. It is a
// module of its own so that Helm's dependencies stay out of imagepind's.
package helm_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "imagepin"
	namespace = "imagepin"
	// A CA bundle stands in for the cluster's, which helm template cannot look up.
	testCA = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"
)

// monitoringAPIs are what a cluster with the Prometheus Operator serves.
var monitoringAPIs = []string{"monitoring.coreos.com/v1", "monitoring.coreos.com/v1/PrometheusRule",
	"monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor"}

// object is one rendered manifest, decoded.
type object = map[string]any

// rendered is what the chart gave: every object by "Kind namespace/name" (namespace ""
// for cluster-scoped ones), and the file each came from.
type rendered struct {
	objects map[string]object
	files   map[string]string
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load %s: %v", chartDir, err)
	}
	return ch
}

// values are the test's base values (the CAs given) with over merged onto them.
func values(over map[string]any) map[string]any {
	v := map[string]any{"nodeIdentity": map[string]any{"clientCA": testCA, "servingCA": testCA}}
	return chartutil.CoalesceTables(over, v)
}

// renderErr renders the chart as helm install does without a cluster, with the extra
// API versions served (apis).
func renderErr(t *testing.T, over map[string]any, apis ...string) (rendered, error) {
	t.Helper()
	ch := loadChart(t)
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}
	caps.APIVersions = append(caps.APIVersions, apis...)
	opts := chartutil.ReleaseOptions{Name: "imagepin", Namespace: namespace, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, values(over), opts, caps)
	if err != nil {
		return rendered{}, err
	}
	out, err := engine.Render(ch, vals)
	if err != nil {
		return rendered{}, err
	}
	r := rendered{objects: map[string]object{}, files: map[string]string{}}
	for _, file := range slices.Sorted(maps.Keys(out)) {
		if strings.HasSuffix(file, "NOTES.txt") {
			continue
		}
		for _, doc := range strings.Split(out[file], "\n---\n") {
			var o object
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("%s: %v\n%s", file, err, doc)
			}
			if len(o) == 0 {
				continue
			}
			k := key(o)
			if _, dup := r.objects[k]; dup {
				t.Fatalf("%s: %s rendered twice", file, k)
			}
			r.objects[k], r.files[k] = o, file
		}
	}
	return r, nil
}

func render(t *testing.T, over map[string]any, apis ...string) rendered {
	t.Helper()
	r, err := renderErr(t, over, apis...)
	if err != nil {
		t.Fatalf("render %v: %v", over, err)
	}
	return r
}

func key(o object) string {
	return fmt.Sprintf("%s %s/%s", str(o, "kind"), str(o, "metadata", "namespace"), str(o, "metadata", "name"))
}

// get walks o by map keys and list indexes (ints).
func get(o any, path ...any) any {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, ok := o.(map[string]any)
			if !ok {
				return nil
			}
			o = m[p]
		case int:
			l, ok := o.([]any)
			if !ok || p >= len(l) {
				return nil
			}
			o = l[p]
		}
	}
	return o
}

func str(o any, path ...any) string {
	s, _ := get(o, path...).(string)
	return s
}

func (r rendered) get(t *testing.T, k string) object {
	t.Helper()
	o, ok := r.objects[k]
	if !ok {
		t.Fatalf("no %s among %v", k, slices.Sorted(maps.Keys(r.objects)))
	}
	return o
}
