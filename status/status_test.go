package status

import (
	"testing"
	"time"
)

func TestSetConditionKeepsTransitionTime(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	var s Set
	s.SetCondition(Condition{Type: ConditionReady, Status: False, Reason: ReasonNotReady}, t0)
	s.SetCondition(Condition{Type: ConditionReady, Status: False, Reason: ReasonNotReady, Message: "x"}, t1)
	if got := s.Condition(ConditionReady); got.LastTransitionTime != t0 || got.Message != "x" {
		t.Fatalf("same status must keep the transition time and take the new message: %+v", got)
	}
	s.SetCondition(Condition{Type: ConditionReady, Status: True, Reason: ReasonAllImagesPinned}, t1)
	if got := s.Condition(ConditionReady); got.LastTransitionTime != t1 || got.Status != True {
		t.Fatalf("a status change must move the transition time: %+v", got)
	}
	if len(s.Conditions) != 1 {
		t.Fatalf("conditions: %d, want 1", len(s.Conditions))
	}
}

func TestSummary(t *testing.T) {
	n := Node{Sets: []Set{
		{Name: "a", Phase: Ready}, {Name: "b", Phase: Ready},
		{Name: "c", Phase: Pulling, ImagesReady: 37, ImagesTotal: 120},
	}}
	if got, want := n.Summary(), "2 sets Ready, 1 Pulling 37/120 images"; got != want {
		t.Fatalf("Summary() = %q, want %q", got, want)
	}
	n = Node{}
	if got := n.Summary(); got != "no sets for this node" {
		t.Fatalf("empty summary = %q", got)
	}
}
