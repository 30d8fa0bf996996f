// Package leaks is what TestLoopStateOwned must refuse: a Service that
// holds the loop's state, a handler that names it, a package variable
// of it, and a type that reaches it through another.
package leaks

type Service struct {
	cfg int
	st  *loopState
}

type loopState struct {
	*Service
	live map[string]int
}

type loop struct{ p *loopState }

// gpuMap reaches the loop's state through the loop.
type gpuMap struct{ l *loop }

var global *loopState

func (p *Service) handler() int { return len(p.st.live) }

func (p *loopState) replan() { p.live["a"]++ }

func (l *loop) run() { l.p.replan() }

func New() *Service {
	p := &Service{}
	(&loopState{Service: p}).replan()
	return p
}
