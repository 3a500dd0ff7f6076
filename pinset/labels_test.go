package pinset

import "testing"

func TestLabelsFile(t *testing.T) {
	l, err := ParseLabelsFile([]byte(`{"node-role.kubernetes.io/worker": "", "zone": "a"}`))
	if err != nil || l["zone"] != "a" {
		t.Fatalf("%v %v", l, err)
	}
	for _, bad := range []string{`[]`, `null`, `{"a": 1}`, `{"bad key!": ""}`, `{`} {
		if _, err := ParseLabelsFile([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	m := MergeLabels(map[string]string{"a": "1", "b": "1"}, map[string]string{"b": "2"})
	if m["a"] != "1" || m["b"] != "2" {
		t.Fatalf("merge: %v", m)
	}
}
