package status

import (
	"fmt"
	"sort"
	"strings"
)

// Summary is a one-line description of a node's sets, as systemd's STATUS= shows it:
// "2 sets Ready, 1 Pulling 37/120 images".
func (n *Node) Summary() string {
	if len(n.Sets) == 0 {
		if len(n.FileErrors) > 0 {
			return fmt.Sprintf("no sets for this node; %d file errors", len(n.FileErrors))
		}
		return "no sets for this node"
	}
	count := map[Phase]int{}
	pullingReady, pullingTotal := 0, 0
	for _, s := range n.Sets {
		count[s.Phase]++
		if s.Phase == Pulling {
			pullingReady += s.ImagesReady
			pullingTotal += s.ImagesTotal
		}
	}
	var parts []string
	for _, p := range []Phase{Ready, Pulling, Pending, Failed} {
		c := count[p]
		if c == 0 {
			continue
		}
		noun := "sets"
		if c == 1 && len(parts) == 0 {
			noun = "set"
		}
		part := fmt.Sprintf("%d %s", c, p)
		if len(parts) == 0 {
			part = fmt.Sprintf("%d %s %s", c, noun, p)
		}
		if p == Pulling {
			part += fmt.Sprintf(" %d/%d images", pullingReady, pullingTotal)
		}
		parts = append(parts, part)
	}
	if len(n.FileErrors) > 0 {
		parts = append(parts, fmt.Sprintf("%d file errors", len(n.FileErrors)))
	}
	return strings.Join(parts, ", ")
}

// SortSets orders sets by name, the order in which they are admitted.
func (n *Node) SortSets() {
	sort.Slice(n.Sets, func(i, j int) bool { return n.Sets[i].Name < n.Sets[j].Name })
}
