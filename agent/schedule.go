package agent

import (
	"math/rand/v2"
	"time"
)

// schedule is every time something comes due: retries with backoff (the runtime, pins,
// the disk check, releases, each image's pull, rechecks, a full disk), and unpins. Each
// is set where it is decided and cleared where it stops mattering; the loop's wake-up
// asks the schedule alone (nextWake), so nothing due can be forgotten by a hand-kept list.
type schedule struct {
	at map[string]time.Time
}

func newSchedule() *schedule { return &schedule{at: map[string]time.Time{}} }

func (s *schedule) set(key string, t time.Time) { s.at[key] = t }

func (s *schedule) clear(key string) { delete(s.at, key) }

// when is key's time, if it is on the schedule.
func (s *schedule) when(key string) (time.Time, bool) {
	t, ok := s.at[key]
	return t, ok
}

// next is the earliest time after after; ok is false when nothing is due after it.
func (s *schedule) next(after time.Time) (at time.Time, ok bool) {
	for _, t := range s.at {
		if t.After(after) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	return at, !at.IsZero()
}

// retry is an exponential backoff with jitter whose next attempt is on the schedule.
type retry struct {
	key      string
	sched    *schedule
	attempts int
	next     time.Time
}

func (r *retry) fail(now time.Time, maxDelay time.Duration, rnd *rand.Rand) {
	r.attempts++
	d := time.Second << min(r.attempts-1, 16)
	d = min(d, maxDelay)
	// ±20% jitter so that a fleet of nodes does not retry in step.
	d = time.Duration(float64(d) * (0.8 + 0.4*rnd.Float64()))
	r.next = now.Add(d)
	if r.sched != nil {
		r.sched.set(r.key, r.next)
	}
}

// dueAt makes the next attempt due at t, ahead of the backoff (the cause of the
// failure may have passed).
func (r *retry) dueAt(t time.Time) {
	r.next = t
	if r.sched != nil {
		r.sched.set(r.key, t)
	}
}

func (r *retry) reset() {
	r.attempts, r.next = 0, time.Time{}
	if r.sched != nil {
		r.sched.clear(r.key)
	}
}

func (r *retry) due(now time.Time) bool { return r.next.IsZero() || !now.Before(r.next) }

// scheduled says whether a retry is pending (failed, not reset) and due.
func (r *retry) scheduled(now time.Time) bool { return !r.next.IsZero() && !now.Before(r.next) }
