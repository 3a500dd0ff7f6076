// Package pullwidth finds how many pulls to run at once. The best width depends on the
// link and the runtime, and no constant suits them all: behind a link that limits each
// connection (a far registry, a satellite) every extra pull adds throughput up to the
// widest; on loopback CRI-O is CPU-bound and anything from 4 up is about alike; behind
// a shared bottleneck extra pulls only queue; an overloaded registry answers errors.
//
// A Controller starts at the widest it may use (pull_concurrency), or, when the disk
// check found the registry near (LAN latency), at 8: a set that fits in a round or two
// never waits for a ramp. It holds that width Hold rounds before its first probe: a
// narrower width is never faster, only fewer connections, and one round (8 pulls) on a
// busy node varies by more than the 5% a probe tells apart, so probing at once took 40
// images on loopback from 8 at once to 2 (`make bench`, P1). It measures the throughput
// of rounds (as many completions as the width, at least 8; bytes per second, images
// when sizes are unknown) and probes: half the width, kept while the throughput stays
// within 5% of what the widest measured width gave (the same speed for fewer
// connections), given up when it drops; after a hold, twice the width, kept when the
// throughput grows by 10% or more. A probe that fails doubles the hold before the next
// (8 rounds, up to 128): a width that is right is seldom disturbed. Probes never go
// below 2 pulls (one alone is the kubelet's serial pull, never the fastest). After each
// change one round is let pass unmeasured, for the pulls started at the old width to
// finish. A transient pull error (network, 5xx, throttling, a timeout) halves the width
// at once, down to 1, and holds it. Rounds in which the agent had no more work to give
// (the set's tail, a disk check pending) measure nothing and decide nothing.
package pullwidth

import "time"

const (
	// Hold is how many rounds a width is kept at the start, after an error, or after a
	// first failed probe; MaxHold after many.
	Hold    = 8
	MaxHold = 128
	// probeFloor is the narrowest a probe goes.
	probeFloor = 2
	// MinRound is the fewest completions a round measures.
	MinRound = 8
	// keepDown: a narrower round keeps at least this share of the reference throughput.
	keepDown = 0.95
	// keepUp: a wider round must bring at least this much more.
	keepUp = 1.10
)

type mode int

const (
	holding mode = iota
	probingDown
	probingUp
)

// Controller is the width of one agent's pulls. It is not safe for concurrent use: the
// agent's loop owns it.
type Controller struct {
	min, max int
	width    int

	mode     mode
	hold     int     // rounds left before the next probe
	holdLen  int     // the hold after the next failed probe
	nextUp   bool    // the next probe widens (after a narrowing failed)
	settle   bool    // the round under way follows a change: not measured
	refWidth int     // the width to go back to when a probe fails
	refRate  float64 // the throughput a probe is held against

	// the round being measured
	start      time.Time
	bytes      float64
	done       int
	saturated  bool
	knownBytes bool
}

// DefaultWidest is the most pulls at once when the configuration names none
// ([cri] pull_concurrency = 0). How many run is found as they go: from NearWidth for a
// near registry, from the most for a far one, then by the throughput each width gives.
// `make bench`: behind a 100 ms link 40 images took 6.7 s at 64 at once, 9.5 s at 32,
// 14.5 s at 8.
const DefaultWidest = 64

// New returns a controller between 1 and widest, starting at widest.
func New(widest int) *Controller {
	widest = max(widest, 1)
	return &Controller{min: 1, max: widest, width: widest, hold: Hold, holdLen: Hold, saturated: true, knownBytes: true}
}

// Near is the registry round trip (as the disk check measures it: the least time of a
// ping and a manifest, over two) under which the runtime, not the link, limits pulls;
// NearWidth is where pulls from such a registry start. `make bench` on loopback: CRI-O
// pulls 40 images in 5.28, 5.11, 5.38 s at 4, 8, 64 at once (medians of 3), and the
// disk check measures the loopback registry at 18-24 ms while it sizes 40 images at
// once (their queueing), a registry 50 ms away at 82 ms, one 200 ms away at 308 ms. A
// LAN registry is near; one 20 ms away may count as near too, and the probes widen
// from there.
const (
	Near      = 40 * time.Millisecond
	NearWidth = 8
)

// Link tells the controller how far the registry is (the disk check's measured round
// trip), before any pull has finished: a near registry starts at NearWidth, a far one at
// the widest, where every connection more is throughput more (the bandwidth-delay
// product). Probes take it from there.
func (c *Controller) Link(rtt time.Duration) {
	if !c.start.IsZero() || rtt <= 0 {
		return
	}
	if rtt < Near {
		c.width = min(c.max, NearWidth)
	} else {
		c.width = c.max
	}
}

// Width is how many pulls may run at once now.
func (c *Controller) Width() int { return c.width }

// Max is the widest the controller may go.
func (c *Controller) Max() int { return c.max }

// Unsaturated says the agent had no more pulls to start while below the width: the
// round measures the work available, not the width.
func (c *Controller) Unsaturated() { c.saturated = false }

// Transient records a pull that failed in a way that more pressure makes worse: halve.
func (c *Controller) Transient(now time.Time) {
	c.width = max(c.min, c.width/2)
	c.mode, c.hold, c.holdLen, c.nextUp, c.settle = holding, Hold, Hold, true, true
	c.refRate = 0
	c.resetRound(now)
}

// Done records a finished pull of size bytes (0: unknown) at now; it may end a round
// and change the width.
func (c *Controller) Done(now time.Time, bytes int64) {
	if c.start.IsZero() {
		// The first completion opens the first round: the time before it is the
		// pulls' start-up, common to every width.
		c.resetRound(now)
		return
	}
	c.done++
	if bytes > 0 {
		c.bytes += float64(bytes)
	} else {
		c.knownBytes = false
	}
	if c.done < max(c.width, MinRound) {
		return
	}
	elapsed := now.Sub(c.start).Seconds()
	rate := 0.0
	if elapsed > 0 {
		if c.knownBytes {
			rate = c.bytes / elapsed
		} else {
			rate = float64(c.done) / elapsed
		}
	}
	switch {
	case !c.saturated || rate <= 0:
	case c.settle:
		c.settle = false
	default:
		c.decide(rate)
	}
	c.resetRound(now)
}

func (c *Controller) decide(rate float64) {
	switch c.mode {
	case probingDown:
		if rate >= keepDown*c.refRate {
			c.holdLen = Hold
			c.probe(false) // as fast with fewer: try fewer still, against the same reference
			return
		}
		c.back()
		c.nextUp = true
	case probingUp:
		if rate >= keepUp*c.refRate {
			c.holdLen = Hold
			c.refWidth, c.refRate = c.width, rate
			c.probe(true)
			return
		}
		c.back()
		c.nextUp = false
	default:
		c.refWidth, c.refRate = c.width, rate
		if c.hold > 0 {
			c.hold--
			return
		}
		c.probe(c.nextUp)
	}
}

// back returns to the last width that held, and holds it, longer each time.
func (c *Controller) back() {
	c.width, c.mode, c.hold, c.settle = c.refWidth, holding, c.holdLen, true
	c.holdLen = min(2*c.holdLen, MaxHold)
}

// probe tries half (or twice) the width, if there is room that way.
func (c *Controller) probe(up bool) {
	switch {
	case up && c.width < c.max:
		c.width, c.mode, c.settle = min(c.max, c.width*2), probingUp, true
	case !up && c.width > probeFloor:
		if c.mode == probingDown {
			c.refWidth = c.width // held so far: the way back
		}
		c.width, c.mode, c.settle = max(probeFloor, c.width/2), probingDown, true
	default:
		// Nothing to try that way: hold, then try the other way.
		c.mode, c.hold, c.nextUp = holding, c.holdLen, !up
		c.holdLen = min(2*c.holdLen, MaxHold)
	}
}

func (c *Controller) resetRound(now time.Time) {
	c.start, c.bytes, c.done, c.saturated, c.knownBytes = now, 0, 0, true, true
}
