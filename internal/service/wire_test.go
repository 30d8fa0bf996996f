package service

import "github.com/poolplanner/poolplanner/client"

// service is the Service a test holds, whether it holds it whole or
// drives its loop state by hand (drive): loopState embeds it.
func (p *Service) service() *Service { return p }

// wireClient is the client over the JetStream the service p publishes
// to, for a test to read back what a launcher would.
func wireClient(p interface{ service() *Service }) *client.Client {
	return p.service().plans.(jsPlans).Client()
}
