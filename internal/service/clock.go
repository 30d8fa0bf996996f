package service

import "time"

// Clock is the time the planner's loop and its leaser go by (their
// timers, their notion of now): the system's by default; tests may pass
// one they move by hand.
type Clock interface {
	Now() time.Time
	// NewTimer is time.NewTimer's.
	NewTimer(d time.Duration) Timer
}

// Timer is a timer a Clock makes: time.Timer's methods, C a method.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration) bool
	Stop() bool
}

// systemClock is the system's time.
type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) Timer { return systemTimer{time.NewTimer(d)} }

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time        { return t.t.C }
func (t systemTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
func (t systemTimer) Stop() bool                 { return t.t.Stop() }

// since is how long ago t was by the service's clock; until, how long
// until t.
func (p *Service) since(t time.Time) time.Duration { return p.clock.Now().Sub(t) }
func (p *Service) until(t time.Time) time.Duration { return t.Sub(p.clock.Now()) }

// after is a channel that receives once d has passed by the service's
// clock, and a func that stops its timer.
func (p *Service) after(d time.Duration) (<-chan time.Time, func() bool) {
	t := p.clock.NewTimer(d)
	return t.C(), t.Stop
}
