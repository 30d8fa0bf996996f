package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/poolplanner/poolplanner/client"
	"github.com/poolplanner/poolplanner/internal/wire"
	"github.com/poolplanner/poolplanner/plan"
)

// PutSummary stores s as its plan's latest summary, replacing the one
// before (client.Client.Summary reads it).
func (s *PlanStore) PutSummary(ctx context.Context, sum *plan.Summary) error {
	data, err := json.Marshal(sum)
	if err != nil {
		return fmt.Errorf("summary of plan %s revision %d: %w", sum.Name, sum.Revision, err)
	}
	if _, err := s.putObject(ctx, client.PlansBucket, wire.SummaryObject(sum.Name), data); err != nil {
		return fmt.Errorf("summary of plan %s revision %d: %w", sum.Name, sum.Revision, err)
	}
	return nil
}
