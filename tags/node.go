package tags

import (
	"context"
	"fmt"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/imagepin/imagepin/pinset"
	"github.com/imagepin/imagepin/status"
	"github.com/imagepin/imagepin/tags/check"
	"github.com/imagepin/imagepin/tags/endpoint"
	"github.com/imagepin/imagepin/tags/keep"
)

// Parts are a node's tag parts, built by the composition root for the runtime found.
type Parts struct {
	// Keeper makes the runtime hold the wanted tags (one without a runtime, keep.New
	// with nil, where the runtime cannot be made to: Status says why).
	Keeper *keep.Keeper
	// Checker asks the registries which digest each wanted tag names now; its tags are
	// the keeper's (Keeper.Tags).
	Checker *check.Checker
	// Endpoint is the node-local mirror's TLS endpoint for tags that CRI-O pulls a tag
	// through; nil on containerd (the keeper writes image records) and without
	// [peers] tag_address.
	Endpoint *endpoint.Server
}

// Node is the tags' run-time on a node.
type Node struct {
	keeper   *keep.Keeper
	checker  *check.Checker
	endpoint *endpoint.Server
	onChange func()
	// fault says why the endpoint is not served (empty: it is, or there is none).
	fault atomic.Pointer[string]
}

// New takes the parts; onChange (nil: none) is called whenever what Status reports may
// have changed: a pass of the keeper changed the tags held or failed, the check found
// a tag moved (or back), the endpoint could not listen. Run starts them.
func New(p Parts, onChange func()) *Node {
	if onChange == nil {
		onChange = func() {}
	}
	p.Keeper.OnChange, p.Checker.OnChange = onChange, onChange
	return &Node{keeper: p.Keeper, checker: p.Checker, endpoint: p.Endpoint, onChange: onChange}
}

// Want sets the tags the desired sets pin (agent.Tags); it never blocks.
func (n *Node) Want(tags []pinset.Tag) { n.keeper.Want(tags) }

// Arrived says image is on the node now (agent.Tags): a tag waiting for it is made at
// once.
func (n *Node) Arrived(image string) { n.keeper.Arrived(image) }

// Held says whether the runtime holds the pinned tag t.Name as t.Image (the keeper's
// answer): what the registry-gone verdict asks of each pinned tag.
func (n *Node) Held(t pinset.Tag) bool { return n.keeper.Held(t) }

// Run runs the check, the endpoint and the keeper until ctx ends, and returns nil then.
// The endpoint listens before the keeper starts: a pull of a tag while it does not
// would go on to the registry. An endpoint that cannot listen (another process holds
// the address) is a fault in Status, and the keeper is not started: no tag is pulled
// (it would not come from here) until imagepind restarts with the address free; the
// check runs on, and so does the rest of imagepind.
func (n *Node) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return n.checker.Run(ctx) })
	if n.endpoint != nil {
		l, err := n.endpoint.Listen()
		if err != nil {
			fault := fmt.Sprintf("the node-local mirror's tag endpoint %s: %v: tags are not pre-loaded until imagepind restarts with the address free", n.endpoint.Address, err)
			n.fault.Store(&fault)
			if n.endpoint.Log != nil {
				n.endpoint.Log.WithError(err).Error("tag endpoint not served; tags are not pre-loaded")
			}
			n.onChange()
			return g.Wait()
		}
		g.Go(func() error { return n.endpoint.ServeOn(ctx, l) })
	}
	g.Go(func() error { return n.keeper.Run(ctx) })
	return g.Wait()
}

// Status is the tags for the node's status (agent.Tags): how many the sets
// pin, how many the runtime holds, which moved in their registry; and the faults of the
// pre-load: each tag the keeper could not make, the endpoint not served, a runtime the
// keeper cannot make hold tags. Nil and no fault while the sets pin no tag.
func (n *Node) Status() (*status.Tags, []string) {
	tags := n.keeper.Tags()
	if len(tags) == 0 {
		return nil, nil
	}
	st := &status.Tags{Pinned: len(tags), Moved: n.checker.Moved(), Kept: n.keeper.Runs()}
	for _, t := range tags {
		if n.keeper.Held(t) {
			st.Held++
		}
	}
	faults := n.keeper.Faults()
	if f := n.fault.Load(); f != nil {
		faults = append(faults, *f)
	}
	if !n.keeper.Runs() {
		faults = append(faults, fmt.Sprintf("%d pinned tags are not pre-loaded: CRI-O learns a tag from the node-local mirror's tag endpoint, which needs [peers] enabled and tag_address (docs/tags.md); their digests are pinned", len(tags)))
	}
	return st, faults
}
