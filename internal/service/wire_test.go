package service

import "github.com/poolplanner/poolplanner/client"

// wireClient is the client over the JetStream the service p publishes
// to, for a test to read back what a launcher would.
func wireClient(p *Service) *client.Client { return p.plans.(jsPlans).Client() }
