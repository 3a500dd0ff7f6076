package status

import "time"

// Tags are the tags the sets pin on this node (repo:tag@sha256:…): how many, how many
// the runtime holds as their pinned digests, and those whose registry now names
// another digest (the pinned one is still what the node has and serves).
type Tags struct {
	Pinned int        `json:"pinned"`
	Held   int        `json:"held"`
	Moved  []MovedTag `json:"moved,omitempty"`
}

// MovedTag is a pinned tag its registry names another digest for.
type MovedTag struct {
	Tag      string `json:"tag"`
	Pinned   string `json:"pinned"`
	Registry string `json:"registry"`
	// Since is when the move was first seen.
	Since time.Time `json:"since"`
}

// Image is the pinned digest reference (repo@sha256:…).
func (m MovedTag) Image() string {
	for i := len(m.Tag) - 1; i >= 0 && m.Tag[i] != '/'; i-- {
		if m.Tag[i] == ':' {
			return m.Tag[:i] + "@" + m.Pinned
		}
	}
	return m.Tag + "@" + m.Pinned
}
