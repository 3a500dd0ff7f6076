package clusterstatus

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/record"

	"github.com/imagepin/imagepin/api/v1alpha1"
)

func withConditions(nodes string, cs ...metav1.Condition) v1alpha1.Status {
	return v1alpha1.Status{Nodes: nodes, Conditions: cs}
}

// An Event marks Ready or Degraded turning True with a write; none for a status that
// stays, none for one that turns False.
func TestEventsOnTransitions(t *testing.T) {
	ready := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "AllNodesReady", Message: "3/3 nodes ready"}
	notReady := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "NodesFailed", Message: "2/3 nodes ready"}
	degraded := metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: "InsufficientDiskSpace", Message: "node-2: no space"}
	fine := metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: "AsExpected"}
	u := &unstructured.Unstructured{}
	u.SetName("app")
	u.SetUID("uid-app")
	for _, tc := range []struct {
		name     string
		old, cur v1alpha1.Status
		want     []string
	}{
		{"first status, pulling", v1alpha1.Status{}, withConditions("0/3", notReady, fine), nil},
		{"turns ready", withConditions("2/3", notReady, fine), withConditions("3/3", ready, fine),
			[]string{"Normal SetReady AllNodesReady (nodes 3/3): 3/3 nodes ready"}},
		{"stays ready", withConditions("3/3", ready, fine), withConditions("3/3", ready, fine), nil},
		{"degrades", withConditions("3/3", ready, fine), withConditions("2/3", notReady, degraded),
			[]string{"Warning SetDegraded InsufficientDiskSpace (nodes 2/3): node-2: no space"}},
		{"recovers from degraded", withConditions("2/3", notReady, degraded), withConditions("3/3", ready, fine),
			[]string{"Normal SetReady AllNodesReady (nodes 3/3): 3/3 nodes ready"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := record.NewFakeRecorder(10)
			l := &Loop{cfg: Config{Events: events}}
			l.recordEvents(u, tc.old, tc.cur)
			var got []string
			for len(events.Events) > 0 {
				got = append(got, <-events.Events)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("events %q, want %q", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("events %q, want %q", got, tc.want)
				}
			}
		})
	}
}
