package pin

import (
	"context"
	"testing"
)

type plain struct{ wrote int }

func (*plain) Describe() string { return "plain" }
func (*plain) Held() []string   { return []string{"held"} }
func (p *plain) Write(context.Context, []string, func(string) (bool, bool)) (Written, error) {
	p.wrote++
	return Written{}, nil
}
func (*plain) Apply(context.Context) error                      { return nil }
func (*plain) InEffect(context.Context, []string) (bool, error) { return true, nil }
func (*plain) Pulled(context.Context, string) (bool, error)     { return false, nil }
func (*plain) Support(string) (Support, error)                  { return Support{}, nil }

type watching struct{ plain }

func (*watching) Watch(context.Context, func()) error { return nil }

type records struct{ plain }

func (*records) PinsRecords() bool { return true }

type both struct{ plain }

func (*both) Watch(context.Context, func()) error { return nil }
func (*both) PinsRecords() bool                   { return true }

// outer replaces Write and embeds the Pinner it wraps, as decorators do: by itself it
// hides every capability.
type outer struct {
	Pinner
	wrote int
}

func (o *outer) Write(ctx context.Context, p []string, i func(string) (bool, bool)) (Written, error) {
	o.wrote++
	return o.Pinner.Write(ctx, p, i)
}

// Each capability of the inner pinner is still found on the decorated one, and none is
// made up; Write is the outer's, the rest the inner's.
func TestDecoratedKeepsEveryCapability(t *testing.T) {
	for _, c := range []struct {
		name             string
		inner            Pinner
		watches, records bool
	}{
		{"none", &plain{}, false, false},
		{"Watcher", &watching{}, true, false},
		{"RecordPinner", &records{}, false, true},
		{"both", &both{}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := &outer{Pinner: c.inner}
			if _, ok := Pinner(o).(Watcher); ok {
				t.Fatal("the test's outer pinner is expected to hide capabilities")
			}
			d := Decorated(o, c.inner)
			if _, ok := d.(Watcher); ok != c.watches {
				t.Errorf("Watcher: %v, want %v", ok, c.watches)
			}
			if _, ok := d.(RecordPinner); ok != c.records {
				t.Errorf("RecordPinner: %v, want %v", ok, c.records)
			}
			if PinsRecords(d) != c.records {
				t.Errorf("PinsRecords: %v", PinsRecords(d))
			}
			if _, err := d.Write(context.Background(), nil, nil); err != nil || o.wrote != 1 {
				t.Errorf("Write went past the outer pinner: %d, %v", o.wrote, err)
			}
			if h := d.Held(); len(h) != 1 || h[0] != "held" || d.Describe() != "plain" {
				t.Errorf("Held %v, Describe %q: not the inner's", h, d.Describe())
			}
		})
	}
}
