package pinset

import (
	"strings"
	"testing"
)

// An imagepin.io object as `kubectl get -o yaml` prints it (status, managedFields and
// all) is a valid set file: one document works in the API and in the sets directory.
func TestParseImagepinObject(t *testing.T) {
	text := `
apiVersion: imagepin.io/v1alpha1
kind: PinnedImageSet
metadata:
  name: zone-a
  uid: 0b6a3f0e-1111-4c4c-9d9d-000000000001
  generation: 3
  resourceVersion: "981"
  labels: {machineconfiguration.openshift.io/role: worker}
  managedFields: [{manager: kubectl, operation: Apply}]
spec:
  nodeSelector: {matchLabels: {topology.kubernetes.io/zone: a}}
  pinnedImages:
  - name: quay.io/openshift/a@` + d1 + `
status:
  nodes: 1/2
  conditions: [{type: Ready, status: "False"}]
`
	res, err := ParseSetFile("cluster/zone-a.json", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	s := res.Sets[0]
	if s.UID != "0b6a3f0e-1111-4c4c-9d9d-000000000001" || len(s.Images) != 1 || len(res.Warnings) != 0 {
		t.Fatalf("set %+v warnings %v", s, res.Warnings)
	}
	for _, c := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"topology.kubernetes.io/zone": "a", "node-role.kubernetes.io/worker": ""}, true},
		{map[string]string{"topology.kubernetes.io/zone": "a"}, false}, // not in the pool
		{map[string]string{"topology.kubernetes.io/zone": "b", "node-role.kubernetes.io/worker": ""}, false},
	} {
		if got := s.Selector.Matches(c.labels); got != c.want {
			t.Errorf("selector %s on %v: %v, want %v", s.Selector, c.labels, got, c.want)
		}
	}
}

func TestImagepinSelectorRules(t *testing.T) {
	doc := func(labels, selector string) string {
		return "apiVersion: imagepin.io/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: s" + labels + "}\nspec:\n" + selector +
			"  pinnedImages: [{name: quay.io/a/b@" + d1 + "}]\n"
	}
	worker := map[string]string{"node-role.kubernetes.io/worker": ""}
	// Neither selector nor pool: no node, with a warning that says how to select all.
	res, err := ParseSetFile("a.yaml", []byte(doc("", "")))
	if err != nil {
		t.Fatal(err)
	}
	if res.Sets[0].Selector.Matches(worker) || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "nodeSelector: {}") {
		t.Fatalf("no selector: matches=%v warnings=%v", res.Sets[0].Selector.Matches(worker), res.Warnings)
	}
	// {} selects every node.
	res, err = ParseSetFile("a.yaml", []byte(doc("", "  nodeSelector: {}\n")))
	if err != nil || !res.Sets[0].Selector.Matches(nil) {
		t.Fatalf("empty selector: %v", err)
	}
	// The pool label alone selects the pool.
	res, err = ParseSetFile("a.yaml", []byte(doc(", labels: {machineconfiguration.openshift.io/role: worker}", "")))
	if err != nil || !res.Sets[0].Selector.Matches(worker) || res.Sets[0].Selector.Matches(nil) {
		t.Fatalf("pool label: %v", err)
	}
	// An empty pool is an error naming the label.
	_, err = ParseSetFile("a.yaml", []byte(doc(`, labels: {machineconfiguration.openshift.io/role: ""}`, "")))
	if err == nil || !strings.Contains(err.Error(), "metadata.labels[machineconfiguration.openshift.io/role]") {
		t.Fatalf("empty pool: %v", err)
	}
	// A bad selector names spec.nodeSelector.
	_, err = ParseSetFile("a.yaml", []byte(doc("", "  nodeSelector: {matchExpressions: [{key: a, operator: Near}]}\n")))
	if err == nil || !strings.Contains(err.Error(), "spec.nodeSelector") {
		t.Fatalf("bad selector: %v", err)
	}
}
