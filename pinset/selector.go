package pinset

import (
	"fmt"

	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// LabelSelector is the Kubernetes metav1.LabelSelector shape, as set documents carry it.
type LabelSelector struct {
	MatchLabels      map[string]string          `json:"matchLabels,omitempty"`
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelSelectorRequirement is one matchExpressions entry.
type LabelSelectorRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// Selector decides whether a set applies to a node. The zero value selects nothing.
type Selector struct {
	sel labels.Selector
	// description says, for status and logs, what the selector is.
	description string
	// none says why the set selects no node whatever its labels ("": it may select
	// some; Nothing).
	none string
}

// Everything selects every node.
func Everything() Selector { return Selector{sel: labels.Everything(), description: "every node"} }

// Nothing selects no node; why says why ("no spec.nodeSelector and no … label").
func Nothing(why string) Selector {
	return Selector{sel: labels.Nothing(), description: why + ": applies to no node", none: why}
}

// SelectsNoNode says why the set targets no node at all, whatever the node's labels (a
// set without the selector that would name its nodes); ok false when it may select
// some. imagepind reads such a set and applies it nowhere; the node's status lists it.
func (s Selector) SelectsNoNode() (why string, ok bool) { return s.none, s.none != "" }

// NewSelector compiles a Kubernetes label selector with its full semantics
// (matchLabels; matchExpressions In, NotIn, Exists, DoesNotExist). An empty selector
// ({}) selects every node, as in Kubernetes.
func NewSelector(ls *LabelSelector) (Selector, error) {
	if ls == nil {
		return Everything(), nil
	}
	sel := labels.NewSelector()
	for _, k := range slices.Sorted(maps.Keys(ls.MatchLabels)) {
		r, err := labels.NewRequirement(k, selection.Equals, []string{ls.MatchLabels[k]})
		if err != nil {
			return Selector{}, fmt.Errorf("matchLabels: %w", err)
		}
		sel = sel.Add(*r)
	}
	for i, e := range ls.MatchExpressions {
		var op selection.Operator
		switch e.Operator {
		case "In":
			op = selection.In
		case "NotIn":
			op = selection.NotIn
		case "Exists":
			op = selection.Exists
		case "DoesNotExist":
			op = selection.DoesNotExist
		default:
			return Selector{}, fmt.Errorf("matchExpressions[%d].operator: %q is not In, NotIn, Exists or DoesNotExist", i, e.Operator)
		}
		r, err := labels.NewRequirement(e.Key, op, e.Values)
		if err != nil {
			return Selector{}, fmt.Errorf("matchExpressions[%d]: %s", i, strings.TrimSpace(err.Error()))
		}
		sel = sel.Add(*r)
	}
	desc := sel.String()
	if desc == "" {
		desc = "every node"
	}
	return Selector{sel: sel, description: desc}, nil
}

// Matches reports whether the node's labels satisfy the selector.
func (s Selector) Matches(nodeLabels map[string]string) bool {
	if s.sel == nil {
		return false
	}
	return s.sel.Matches(labels.Set(nodeLabels))
}

// String describes the selector.
func (s Selector) String() string { return s.description }

// RoleSelector is the selector of a machineconfiguration.openshift.io/v1 set: the
// machineconfiguration.openshift.io/role label names a pool, whose nodes carry
// node-role.kubernetes.io/<pool>.
func RoleSelector(pool string) (Selector, error) {
	key := "node-role.kubernetes.io/" + pool
	if err := ValidateLabels(map[string]string{key: ""}); err != nil {
		return Selector{}, fmt.Errorf("pool %q: %w", pool, err)
	}
	req, err := labels.NewRequirement(key, selection.Exists, nil)
	if err != nil {
		return Selector{}, err
	}
	return Selector{sel: labels.NewSelector().Add(*req), description: key}, nil
}
