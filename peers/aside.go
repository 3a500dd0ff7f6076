package peers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// How long a peer is set aside after a failure, and after serving wrong bytes.
var (
	failedFor  = 30 * time.Second
	corruptFor = 10 * time.Minute
	// stallAfter switches to the next node when a transfer sends nothing this long.
	stallAfter = 15 * time.Second
)

// health is what a node learnt of its peers, shared by its Sources.
type health struct {
	mu  sync.Mutex
	bad map[string]time.Time // a peer set aside until then
	// refusing are the peers refusing connections (a peer is taken out at its next
	// connection).
	refusing map[string]*refusal
	// notPinning are the peers found not to pin an image (peer and root manifest).
	notPinning map[[2]string]time.Time
	// held are the peers' summaries of what their seeds hold (HeldPath); nil: none
	// asked.
	held *holdings
	// busyTimes are how many times in a row each peer was set aside for being busy a
	// whole busyWait, with no answer from it in between (setAsideBusy); busyUntil is
	// when its last busy set-aside ends.
	busyTimes map[string]int
	busyUntil map[string]time.Time
	// sending are the blob transfers under way from each peer, each with what ends its
	// request (wrongBytes ends them all).
	sending map[string]map[*resumer]context.CancelCauseFunc
	// leftAlone are the peers set aside for sending wrong bytes (corruptFor) or for
	// being busy a whole busyWait (setAsideBusy), until then: of the peers set aside,
	// they are not asked for a blob before the registry (plan); those set aside for
	// failing are, once.
	leftAlone map[string]time.Time
	// heard is when each peer last sent this node a byte, on any request (node →
	// *atomic.Int64, Unix nanoseconds): a request that hears nothing while its peer's
	// connection brings bytes for others waits behind them (stillHearing).
	heard sync.Map
}

// queuedFor bounds how long a request hears nothing while its peer sends bytes for
// other requests (stillHearing): a peer answering others and hanging this one is left
// then.
var queuedFor = answerWithin

// hear notes that node sent a byte now.
func (h *health) hear(node string) {
	if node == self {
		return
	}
	now := time.Now().UnixNano()
	if v, ok := h.heard.Load(node); ok {
		v.(*atomic.Int64).Store(now)
		return
	}
	v, _ := h.heard.LoadOrStore(node, new(atomic.Int64))
	v.(*atomic.Int64).Store(now)
}

// stillHearing tells whether a request to node that heard nothing since quiet (its
// start, or its last byte) is waiting behind the peer's other answers: node sent this
// node bytes within stallAfter, and the request has been quiet less than queuedFor.
// The requests to a peer share one connection (HTTP/2), read at the speed of this
// node's download: while it is full, an answer's first bytes (or its 102 Processing)
// wait behind what the peer sent for the other requests, in the connection's buffers.
// A peer whose connection brings bytes is working, not hanging: taking it for a silent
// one set it aside and had the node climb past it, one more copy from the node above
// (at 200 nodes with the links 4x slower, 6,918 of the 7,740 set-asides were requests
// that heard nothing for 15 s).
func (h *health) stillHearing(node string, quiet time.Time) bool {
	v, ok := h.heard.Load(node)
	if !ok || time.Since(quiet) >= queuedFor {
		return false
	}
	return time.Since(time.Unix(0, v.(*atomic.Int64).Load())) < stallAfter
}

// A peer refusing connections has nothing listening at its address: it is starting (nodes
// boot, and imagepind restarts, seconds apart) or stopped. Leaving it at once would lay
// the blobs' trees without it, and each node missing a different set of peers would
// head, and fetch from the registry, blobs other nodes head: a refusing peer is asked
// again every pinPoll while it has refused for less than startWait (counted from its
// first refusal, so a stopped peer costs a node startWait once, not at each request),
// and set aside as any failing peer after that.
var startWait = 15 * time.Second

// refusal is a peer refusing connections: since its first refusal, and when it was
// last tried.
type refusal struct{ since, tried time.Time }

// starting tells whether err is node refusing a connection for less than startWait:
// ask it again. Any other outcome of a request (ctx ending it aside) ends its refusing.
func (s *Source) starting(ctx context.Context, node string, err error) bool {
	refused := errors.Is(err, syscall.ECONNREFUSED)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !refused {
		if ctx.Err() == nil {
			delete(s.refusing, node)
		}
		return false
	}
	now := time.Now()
	r := s.refusing[node]
	if r == nil {
		r = &refusal{since: now}
		s.refusing[node] = r
	}
	r.tried = now
	return now.Sub(r.since) < startWait
}

// refusedEvery is how often a peer refusing connections is tried: every pinPoll at
// first, less often the longer it refuses (every 2 s from 7.5 s on), so that the peers
// still starting cost each node a few refused connections a second in all.
func refusedEvery(since time.Duration) time.Duration {
	return min(pinPoll+since/5, 2*time.Second)
}

// probed is how long to wait before asking node, a peer refusing connections, again:
// one request tries it each refusedEvery, the others wait for what it finds (0: ask now).
func (s *Source) probed(node string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.refusing[node]
	if r == nil || time.Since(r.since) >= startWait {
		return 0
	}
	if wait := refusedEvery(time.Since(r.since)) - time.Since(r.tried); wait > 0 {
		return wait
	}
	r.tried = time.Now()
	return 0
}

// setAsideBusy sets node aside after it was busy for a whole busyWait (a manifest asked
// of it again and again, or a blob's every ancestor): for failedFor the first time, and
// twice as long each time it is found so again without answering anything in between,
// up to busyAsideMax. A peer answering 503 for ever costs each asker a busy window a
// few times an hour, not twice a minute. What counts is busy episodes, not requests:
// every fetch under way when a peer is busy (a pre-load asks for many blobs at once)
// finds it busy for its own window, and those found while its busy set-aside is in
// force add nothing (one step, one log line, per episode).
func (s *Source) setAsideBusy(node string) {
	if node == self {
		return
	}
	now := time.Now()
	s.mu.Lock()
	if now.Before(s.busyUntil[node]) && now.Before(s.bad[node]) {
		s.mu.Unlock()
		return
	}
	n := s.busyTimes[node]
	s.busyTimes[node] = n + 1
	d := busyAsideMax
	if n < 16 {
		d = min(failedFor<<n, busyAsideMax)
	}
	s.busyUntil[node] = now.Add(d)
	// The set-aside is made under the same lock as the count: a fetch finding the peer
	// busy between the two would otherwise count the same episode again.
	until := s.asideUntilLocked(node, now.Add(d), true)
	s.mu.Unlock()
	s.logAside(node, until, fmt.Errorf("busy for %s, %d times in a row: %w", busyWait, n+1, errBusy))
}

// answered notes that node answered a request (not busy): its busy set-asides start
// again from failedFor.
func (s *Source) answered(node string) {
	s.mu.Lock()
	delete(s.busyTimes, node)
	delete(s.busyUntil, node)
	s.mu.Unlock()
}

// setAside sets node aside for d, or for what is left of an earlier set-aside when that
// is longer: a peer set aside for long (wrong bytes, busy again and again) is not taken
// back early by a request of its that failed meanwhile.
func (s *Source) setAside(node string, d time.Duration, why error) {
	if node == self {
		return
	}
	s.mu.Lock()
	until := s.asideUntilLocked(node, time.Now().Add(d), d >= corruptFor || errors.Is(why, errBusy))
	s.mu.Unlock()
	s.logAside(node, until, why)
}

// asideUntilLocked sets node aside until then, or keeps a later end already set, and
// returns the end in force; leave: node is left alone (not asked before the registry)
// as long. s.mu is held.
func (s *Source) asideUntilLocked(node string, until time.Time, leave bool) time.Time {
	if s.bad[node].After(until) {
		until = s.bad[node]
	} else {
		s.bad[node] = until
	}
	if leave {
		if s.leftAlone == nil {
			s.leftAlone = map[string]time.Time{}
		}
		s.leftAlone[node] = until
	}
	return until
}

func (s *Source) logAside(node string, until time.Time, why error) {
	s.Log.WithError(why).WithField("peer", node).WithField("for", time.Until(until).Round(time.Second)).Warn("peers: setting a peer aside")
}

// errWrongBytes ends the transfers under way from a peer found sending wrong bytes:
// each goes on with the next node.
var errWrongBytes = errors.New("set aside meanwhile: found sending wrong bytes")

// wrongBytes sets node aside for corruptFor, found sending wrong bytes (a blob or a
// manifest that does not match, another size than the manifest gives), and ends every
// blob transfer from it under way: the node's other blobs leave it at once, not each
// at its own last byte.
func (s *Source) wrongBytes(node string, why error) {
	if node == self {
		return
	}
	s.setAside(node, corruptFor, why)
	s.mu.Lock()
	var cancels []context.CancelCauseFunc
	for _, c := range s.sending[node] {
		cancels = append(cancels, c)
	}
	s.mu.Unlock()
	for _, c := range cancels {
		c(errWrongBytes)
	}
}

// track notes r's request to node, ended by cancel (untrack: done).
func (s *Source) track(node string, r *resumer, cancel context.CancelCauseFunc) {
	if node == self {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sending == nil {
		s.sending = map[string]map[*resumer]context.CancelCauseFunc{}
	}
	if s.sending[node] == nil {
		s.sending[node] = map[*resumer]context.CancelCauseFunc{}
	}
	s.sending[node][r] = cancel
}

func (s *Source) untrack(node string, r *resumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sending[node], r)
	if len(s.sending[node]) == 0 {
		delete(s.sending, node)
	}
}

// failedAside tells whether node is set aside now for failing: not for sending wrong
// bytes, nor for being busy a whole busyWait.
func (s *Source) failedAside(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	return now.Before(s.bad[node]) && !now.Before(s.leftAlone[node])
}

// isAside tells whether node is set aside now.
func (s *Source) isAside(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Before(s.bad[node])
}
