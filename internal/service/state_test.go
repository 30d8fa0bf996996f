package service

// own is the configured plan's state, made (as read: loaded) when there
// is none: tests that drive a Service without its loop plan the
// configured plan through it.
func (p *Service) own() *planState {
	s := p.addState(p.cfg.Plan)
	s.loaded = true
	return s
}
