package aggregator

import (
	"unique"

	"github.com/imagepin/imagepin/status"
)

// intern makes the strings of a report share one copy with every other report's equal
// strings. Thousands of nodes report the same sets with the same reasons and mostly the
// same messages ("200 images present and pinned"), image references and versions: kept
// once (unique.Make, weak: a string no report holds any more is collected), the store's
// memory grows with what differs between nodes, not with their number.
func intern(n *status.Node) {
	in := func(s *string) {
		if *s != "" {
			*s = unique.Make(*s).Value()
		}
	}
	in(&n.Node.Architecture)
	in(&n.Node.Version)
	in(&n.Node.Runtime.Name)
	in(&n.Node.Runtime.Version)
	in(&n.Node.ImageFilesystem.Path)
	for i := range n.Sets {
		s := &n.Sets[i]
		in(&s.Name)
		in(&s.UID)
		in(&s.SpecHash)
		in(&s.File)
		p := string(s.Phase)
		in(&p)
		s.Phase = status.Phase(p)
		for j := range s.Conditions {
			c := &s.Conditions[j]
			in(&c.Type)
			in(&c.Status)
			in(&c.Reason)
			in(&c.Message)
		}
		for j := range s.FailedImages {
			f := &s.FailedImages[j]
			in(&f.Image)
			in(&f.Reason)
			in(&f.Error)
		}
		if s.Release != nil {
			in(&s.Release.Image)
			in(&s.Release.Version)
			in(&s.Release.Error)
		}
	}
	for i := range n.FileErrors {
		in(&n.FileErrors[i].File)
		in(&n.FileErrors[i].Error)
	}
	for i := range n.Faults {
		in(&n.Faults[i])
	}
}
