package service

// drive is the loop state of p, for tests that drive a Service without
// its loop (as its goroutine, in theirs): they call its replans and put
// inventory straight into its view.
func drive(p *Service) *loopState { return newLoopState(p) }

// own is the configured plan's state, made (as read: loaded) when there
// is none: tests that drive a Service without its loop plan the
// configured plan through it.
func (p *loopState) own() *planState {
	s := p.addState(p.cfg.Plan)
	s.loaded = true
	return s
}

// problemList is the problems the loop state records, sorted by key.
func (p *loopState) problemList() []string { return sortedProblems(p.health.problems, "") }
