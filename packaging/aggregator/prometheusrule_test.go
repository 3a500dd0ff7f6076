// Package manifests_test checks the shipped aggregator manifests against the code.
package manifests_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// rule is one alerting rule of a PrometheusRule.
type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []rule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

var (
	metricName = regexp.MustCompile(`\bimagepin_[a-z0-9_]+`)
	// A label matcher: label="value", label=~"a|b", label!="value".
	matcher = regexp.MustCompile(`\b([a-z_]+)\s*(=~|!=|!~|=)\s*"([^"]*)"`)
)

// codeStrings are the string literals of the module's non-test Go files: every metric
// name and label value the code can export is one.
func codeStrings(t *testing.T, root string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "_output", "test", "testdata", "vendor":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					out[s] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrometheusRuleNamesOnlyWhatTheCodeExports keeps the rules from drifting: every
// metric an expression reads is one the aggregator or imagepind exports (a histogram's
// _bucket, _sum and _count included), and every label value it matches is one the code
// writes.
func TestPrometheusRuleNamesOnlyWhatTheCodeExports(t *testing.T) {
	data, err := os.ReadFile("prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := yaml.UnmarshalStrict(data, &pr); err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Namespace != "imagepin" || pr.Metadata.Name == "" {
		t.Fatalf("prometheusrule.yaml: %s %s %s/%s: want a monitoring.coreos.com/v1 PrometheusRule in namespace imagepin",
			pr.APIVersion, pr.Kind, pr.Metadata.Namespace, pr.Metadata.Name)
	}
	code := codeStrings(t, filepath.Join("..", ".."))
	exported := func(name string) bool {
		if code[name] {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && code[base] {
				return true
			}
		}
		return false
	}

	alerts := map[string]bool{}
	var read []string
	for _, g := range pr.Spec.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: want a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			where := "group " + g.Name + ": alert " + r.Alert
			if r.Alert == "" || alerts[r.Alert] {
				t.Errorf("%s: want a unique alert name", where)
			}
			alerts[r.Alert] = true
			names := metricName.FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Errorf("%s: expr reads no imagepin metric: %s", where, r.Expr)
			}
			for _, n := range names {
				read = append(read, n)
				if !exported(n) {
					t.Errorf("%s: expr reads %s, which neither the aggregator nor imagepind exports", where, n)
				}
			}
			for _, m := range matcher.FindAllStringSubmatch(r.Expr, -1) {
				for _, v := range strings.Split(m[3], "|") {
					if !code[v] {
						t.Errorf("%s: %s matches %q, a value the code never writes", where, m[1], v)
					}
				}
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for: %v", where, err)
				}
			}
			switch r.Labels["severity"] {
			case "info", "warning", "critical":
			default:
				t.Errorf("%s: labels.severity %q: want info, warning or critical", where, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a summary and a description", where)
			}
		}
	}
	for _, want := range []string{"ImagepinSetDegraded", "ImagepinSetNeedsRegistry", "ImagepinNodeNotReporting"} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}
	t.Logf("%d alerts read %v", len(alerts), read)
}

// TestRuleCheckCatchesDrift: the check itself fails on a metric or label value the code
// does not have.
func TestRuleCheckCatchesDrift(t *testing.T) {
	code := codeStrings(t, filepath.Join("..", ".."))
	for _, s := range []string{"imagepin_aggregator_set_nodes", "imagepin_set_phase", "failed", "unknown", "no_space"} {
		if !code[s] {
			t.Errorf("the scan of the code misses %q", s)
		}
	}
	for _, s := range []string{"imagepin_aggregator_set_degraded", "imagepin_set_phase_total"} {
		if code[s] {
			t.Errorf("the scan of the code finds %q, which no code exports", s)
		}
	}
}
