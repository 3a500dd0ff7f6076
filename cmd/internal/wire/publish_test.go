package wire

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/imagepin/imagepin/status"
)

func TestPublishCallsEachInOrderAndSkipsNil(t *testing.T) {
	var got []string
	rec := func(name string) Publisher {
		return func(n status.Node) { got = append(got, name+":"+n.Node.Name) }
	}
	pub := Publish(rec("file"), nil, rec("notify"), rec("metrics"), nil)
	pub(status.Node{Node: status.NodeInfo{Name: "w1"}})
	pub(status.Node{Node: status.NodeInfo{Name: "w2"}})
	want := []string{"file:w1", "notify:w1", "metrics:w1", "file:w2", "notify:w2", "metrics:w2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
}

func TestStatusFileWritesAndSurvivesAFailedWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "status.json")
	StatusFile(path, logrus.New())(status.Node{Node: status.NodeInfo{Name: "w1"}})
	n, err := status.ReadFile(path)
	if err != nil || n.Node.Name != "w1" {
		t.Fatalf("status file: %+v, %v", n, err)
	}
	// A directory that does not exist: logged, not a panic, and the old file is kept.
	StatusFile(filepath.Join(dir, "missing", "status.json"), logrus.New())(status.Node{})
	if n, err := status.ReadFile(path); err != nil || n.Node.Name != "w1" {
		t.Fatalf("status file after a failed write elsewhere: %+v, %v", n, err)
	}
}

func TestJoinFaultsSkipsNilSources(t *testing.T) {
	f := joinFaults(nil, func() []string { return []string{"a"} }, nil, func() []string { return []string{"b", "c"} })
	if got := f(); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Fatalf("faults %v", got)
	}
}
