package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/imagepin/imagepin/mirror"
)

// Blob reads d, of size bytes (its descriptor's), down d's tree: from this node's
// parent, else its parent's parent and so on (the head's turn is the registry), each
// of them filling d the same way while it sends it, so that a blob crosses the
// registry link once and each node uploads it to at most Fanout children while all
// are up. It goes on from where it stopped with the next when one fails (plan). A peer
// announcing another size is refused before anything is read, and one sending more
// than size bytes ends the read; both are set aside as a peer sending wrong bytes is.
func (s *Source) Blob(ctx context.Context, repo string, chain []digest.Digest, d digest.Digest, size int64) (io.ReadCloser, int64, error) {
	if size < 0 {
		return nil, 0, fmt.Errorf("%s: no size known: %w", d, mirror.ErrSize)
	}
	r := &resumer{s: s, ctx: ctx, repo: repo, chain: chain, d: d, size: size, verifier: d.Verifier(),
		plan: &plan{s: s, d: d, asked: map[string]bool{}}}
	if err := r.next(); err != nil {
		return nil, 0, err
	}
	return r, r.size, nil
}

// resumer reads a blob from one node after another.
type resumer struct {
	s     *Source
	ctx   context.Context
	repo  string
	chain []digest.Digest
	d     digest.Digest

	plan   *plan  // who is left to ask
	node   string // who is sending now
	how    asking // how node was asked
	cur    io.ReadCloser
	reqCtx context.Context // cur's request's
	cancel context.CancelFunc
	stall  *time.Timer
	quiet  atomic.Int64 // cur's last byte's time (Unix nanoseconds)
	// fromStore: cur is the peer's own copy (mirror.StoredHeader), not a relay.
	fromStore bool
	// culprit is how many senders there were up to the first one known to send wrong
	// bytes when it stopped (wrongBytes): it stopped within the bytes it holds back
	// until its own copy matches, or was found so for another blob (0: none).
	culprit  int
	size     int64 // the descriptor's: no sender goes past it
	off      int64
	senders  []string
	verifier digest.Verifier
	errs     []error
	// stalledSince: cur's sender stalled (errStalled) and was asked again, with no
	// byte from it since then. cuts: the answers it ended itself while relaying.
	stalledSince time.Time
	cuts         int
}

// next opens the next node that answers, at r.off.
func (r *resumer) next() error {
	r.closeCur()
	for {
		t, ok := r.plan.next(r.ctx)
		if !ok {
			break
		}
		node := t.node
		if node == self && !r.plan.heads() {
			// One copy more from the registry: say why the tree did not send it.
			why := errors.Join(r.errs...)
			if why == nil {
				why = errors.New("every node above it in the blob's tree is set aside")
			}
			r.s.Log.WithError(why).WithField("blob", r.d.String()).Warn("peers: asking the registry for a blob this node's ancestors in its tree should send")
		}
		ctx, cancelCause := context.WithCancelCause(r.ctx)
		cancel := func() { cancelCause(nil) }
		r.s.track(node, r, cancelCause)
		body, err := r.open(ctx, t)
		if err != nil {
			r.s.untrack(node, r)
			cancel()
			switch {
			case r.ctx.Err() != nil:
				return r.ctx.Err()
			case errors.Is(err, errBusy) && t.how == climbing:
				r.plan.busyNow(node)
			case node == self || errors.Is(err, errNotThere):
			case errors.Is(context.Cause(ctx), errWrongBytes):
				// Set aside meanwhile, found sending wrong bytes for another blob.
			case errors.Is(err, mirror.ErrSize):
				r.s.wrongBytes(node, err)
			case resetBySender(err) && t.how == climbing && r.cuts == 0:
				// An ancestor that reset its answer before its first byte, its own
				// source failed: asked once more, as one cutting its relay midway (read).
				r.cuts++
				r.plan.again(turn{node, once})
			default:
				r.s.setAside(node, failedFor, err)
			}
			r.errs = append(r.errs, fmt.Errorf("%s: %w", name(node), err))
			continue
		}
		if node != r.node {
			r.stalledSince, r.cuts = time.Time{}, 0
		}
		r.node, r.how, r.cur, r.cancel, r.reqCtx = node, t.how, body, cancel, ctx
		r.quiet.Store(time.Now().UnixNano())
		r.stall = newStall(func(t *time.Timer) {
			// Behind the peer's other answers on its connection: not stalled
			// (stillHearing).
			if r.s.stillHearing(node, time.Unix(0, r.quiet.Load())) {
				t.Reset(stallAfter)
				return
			}
			cancelCause(errStalled)
		})
		r.senders = append(r.senders, node)
		return nil
	}
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	return fmt.Errorf("no node could send %s: %w", r.d, errors.Join(r.errs...))
}

// open is t's stream of the blob from r.off, refused when it announces another size
// than the descriptor's.
func (r *resumer) open(ctx context.Context, t turn) (io.ReadCloser, error) {
	node := t.node
	r.fromStore = false
	if node == self {
		body, announced, err := r.s.Registry.Blob(ctx, r.repo, r.chain, r.d, r.size)
		if err != nil {
			return nil, err
		}
		if announced >= 0 && announced != r.size {
			body.Close()
			return nil, fmt.Errorf("announced %d bytes, the manifest gives %d: %w", announced, r.size, mirror.ErrSize)
		}
		if r.off > 0 {
			// The registry is read from its first byte: skip what was read.
			if _, err := io.CopyN(io.Discard, body, r.off); err != nil {
				body.Close()
				return nil, err
			}
		}
		return body, nil
	}
	// Every byte came and the end did not (the sender was cut after its last byte): a
	// range from r.off would be one past the end (416), so the blob is asked whole.
	from := r.off
	if from >= r.size {
		from = 0
	}
	// A blob is asked for only up its tree, or from what a peer holds: no hop mark.
	resp, err := r.s.ask(ctx, node, r.repo, "blobs", r.chain, r.d, from, t.how, false)
	if err != nil {
		return nil, err
	}
	r.fromStore = resp.Header.Get(mirror.StoredHeader) != ""
	whole := resp.StatusCode == http.StatusOK
	want := r.size
	if !whole {
		want = r.size - r.off // a 206 from r.off
	}
	if resp.ContentLength >= 0 && resp.ContentLength != want {
		resp.Body.Close()
		return nil, fmt.Errorf("announced %d bytes, the manifest gives %d: %w", resp.ContentLength, want, mirror.ErrSize)
	}
	if whole && r.off > 0 {
		if _, err := io.CopyN(io.Discard, resp.Body, r.off); err != nil {
			resp.Body.Close()
			return nil, err
		}
	}
	return resp.Body, nil
}

// errStalled: a sender sent nothing for stallAfter, its connection silent too.
var errStalled = errors.New("sent nothing for the stall bound, its connection silent too")

// stalled is how long the sender has been stalled, asked again, with no byte since
// (its first stall counts from now).
func (r *resumer) stalled() time.Duration {
	if r.stalledSince.IsZero() {
		r.stalledSince = time.Now()
	}
	return time.Since(r.stalledSince)
}

// heldBack is how close to a blob's end a peer's own copy stops when the peer found it
// not to match: the bytes it holds back (mirror.HoldBack), and what its connection
// had not sent yet when it cut the answer.
const heldBack = mirror.HoldBack + 32<<10

// resetBySender tells whether err is an HTTP/2 stream reset sent by the peer (its
// handler ended the answer), not a connection lost. net/http does not export the
// error's type: its text, fixed since HTTP/2 came to net/http, tells.
func resetBySender(err error) bool {
	return err != nil && strings.Contains(err.Error(), "; received from peer")
}

// lostConnection tells whether err, a request's or its body's on a connection made, is
// that connection ending (every answer on it ends "unexpected EOF", or "connection
// reset" when the peer closed it with bytes unread; "broken pipe" while writing), not a
// stream reset the sender sent.
func lostConnection(err error) bool {
	return (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) && !resetBySender(err)
}

func name(node string) string {
	if node == self {
		return "registry"
	}
	return "peer " + node
}

func (r *resumer) closeCur() {
	if r.cur != nil {
		r.stall.Stop()
		r.cur.Close()
		r.cancel()
		r.s.untrack(r.node, r)
		r.cur = nil
	}
}

func (r *resumer) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if r.cur == nil {
			return 0, io.ErrUnexpectedEOF
		}
		n, err := r.read(p)
		if errors.Is(err, mirror.ErrSize) {
			err = fmt.Errorf("%s: %w", r.d, err)
			r.s.wrongBytes(r.node, err)
			return 0, err
		}
		if n > 0 {
			r.stalledSince = time.Time{}
			r.quiet.Store(time.Now().UnixNano())
			r.stall.Reset(stallAfter)
			r.off += int64(n)
			r.verifier.Write(p[:n])
			if r.node != self {
				r.s.Stats.FromPeers.Add(int64(n))
			}
		}
		if err == io.EOF && r.size >= 0 && r.off < r.size {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF && r.off == r.size && r.ctx.Err() == nil {
			// Every byte came and the end did not: the sender cut its stream after its
			// last byte, as a peer does when the copy it sends turns out, at its end, not
			// to match (its store corrupted on disk). The bytes are all here: they tell,
			// and asking another node for the end would only take it for the culprit.
			err = io.EOF
		}
		switch {
		case err == io.EOF:
			if !r.verifier.Verified() {
				// Whoever sent bytes of this blob is suspect: set them aside, so the
				// next request for it (the runtime's retry) goes elsewhere. Of two or
				// more, one may be innocent: a node relaying a blob that turns out
				// wrong cuts it (it never sends a whole wrong blob), and this node
				// resumed elsewhere after the cut. Those are set aside for failedFor.
				//
				// A sender known to send wrong bytes when it stopped (culprit) was set
				// aside then: those after it sent only what came after, and are not
				// suspect.
				err = fmt.Errorf("%d bytes that do not match %s", r.off, r.d)
				switch {
				case r.culprit > 0:
					for _, s := range r.senders[:r.culprit-1] {
						r.s.setAside(s, failedFor, err)
					}
				case len(r.senders) == 1:
					r.s.wrongBytes(r.senders[0], err)
				default:
					for _, s := range r.senders {
						r.s.setAside(s, failedFor, err)
					}
				}
				return n, err
			}
			return n, io.EOF
		case err != nil:
			if r.ctx.Err() != nil {
				return n, r.ctx.Err()
			}
			if cause := context.Cause(r.reqCtx); errors.Is(cause, errStalled) {
				err = fmt.Errorf("%w (%d of %d bytes in): %w", cause, r.off, r.size, err)
			}
			r.errs = append(r.errs, fmt.Errorf("%s: %w", name(r.node), err))
			switch left := r.size - r.off; {
			case r.node == self:
			case errors.Is(context.Cause(r.reqCtx), errWrongBytes):
				// Set aside meanwhile, found sending wrong bytes for another blob: this
				// transfer goes on with the next node at once, and the peer is the
				// suspect if the blob turns out wrong.
				if r.culprit == 0 {
					r.culprit = len(r.senders)
				}
			case r.fromStore && left > 0 && (left <= heldBack || resetBySender(err)):
				// The peer stopped sending its own copy within the last bytes it holds
				// back until the copy matches, or reset the answer itself (it does so
				// when its copy does not match: what it had sent and this node had not
				// read yet is dropped, so the stop may come earlier): it found its copy
				// wrong (or unreadable). It is set aside as a peer
				// sending wrong bytes (every transfer from it moves on); this one goes on
				// with the next node, and the whole blob's digest tells whether what
				// came before was right.
				if r.culprit == 0 {
					r.culprit = len(r.senders)
				}
				r.s.wrongBytes(r.node, fmt.Errorf("stopped %d bytes before the end of %s, sent from its own copy: the copy does not match its digest: %w", left, r.d, err))
			case (errors.Is(context.Cause(r.reqCtx), errStalled) || lostConnection(err)) && r.how == climbing && r.stalled() < busyWait:
				// An ancestor whose stream stopped midway, its connection silent too, is
				// slow, not bad, as one slow to answer is: it is most likely waiting on
				// its own parent, or short of CPU. So is one whose connection ended
				// midway (its HTTP/2 server drops a connection whose first frames it
				// has not read 2 s after the handshake; one gone refuses the next). It
				// is asked again from where it stopped (it sends what it holds and joins
				// its own fetch) for up to busyWait from its first stall with no byte
				// since. Climbing past it would have its parent send one copy more, or
				// this node head the blob: one copy more from the registry (at 500
				// nodes on 2 CPUs, the head's first child did so once a run in two).
				r.s.Stats.Slow.Add(1)
				if lostConnection(err) {
					r.s.Stats.conns.add("client: connection ended during an answer")
				}
				r.plan.again(turn{r.node, climbing})
			case resetBySender(err) && r.how == climbing && !r.fromStore && r.cuts == 0:
				// An ancestor relaying the blob reset the answer itself: it is up, and
				// its own source failed (it cuts what it relays rather than stall its
				// children); it goes on from its next source, so it is asked once more
				// from where it stopped before it is set aside. At 500 nodes on 2 CPUs,
				// two thirds of the peers set aside were such cuts, each moving the
				// children up the tree and their grandparents to more uploads. Asked
				// once: one that went down refuses the connection, and is not waited
				// for as a peer starting.
				r.cuts++
				r.plan.again(turn{r.node, once})
			default:
				r.s.setAside(r.node, failedFor, err)
			}
			if nerr := r.next(); nerr != nil {
				return n, nerr
			}
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, nil
	}
}

// read reads the current sender, never past r.size: once every byte came, only the
// end may follow (a byte more is mirror.ErrSize).
func (r *resumer) read(p []byte) (int, error) {
	if left := r.size - r.off; left <= 0 {
		var one [1]byte
		n, err := r.cur.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("sent more than the %d bytes the manifest gives: %w", r.size, mirror.ErrSize)
		}
		return 0, err
	} else if left < int64(len(p)) {
		p = p[:left]
	}
	return r.cur.Read(p)
}

func (r *resumer) Close() error {
	r.closeCur()
	return nil
}
