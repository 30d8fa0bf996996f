package planner

import "testing"

// TestLeastGPUsTinyShare (review rev6): a share at or below eps fits
// beside a whole-GPU worker of its own component (fits: share+frac <=
// 1+eps), so the placement holds 2 GPUs, within max_gpus 2; leastGPUs
// counts the share a GPU of its own (3) and WithinQuota refuses the
// valid plan. num_gpus 1e-10 parses ("a fraction in (0, 1]").
func TestLeastGPUsTinyShare(t *testing.T) {
	s := &Spec{MaxGPUs: 2, Placement: Placement{Mode: ModeAuto, Strategy: StrategyDisaggregate, EnvStrategy: EnvStrategyDefault}}
	s.Scheduling.Train = &WorkerGroup{WorkerNum: 0, NumCPUs: 1, NumGPUs: 1}
	s.Scheduling.Eval = &WorkerGroup{WorkerNum: 0, NumCPUs: 1, NumGPUs: 1}
	s.Scheduling.Env = []WorkerGroup{{WorkerNum: 1, NumCPUs: 1, NumGPUs: 2}, {WorkerNum: 1, NumCPUs: 1, NumGPUs: 1e-10}}
	doc, err := Compute(s, uniformNodes(1, 8, 64))
	if err != nil || !doc.Valid() {
		t.Fatalf("placed: %v", err)
	}
	if held, least := HeldGPUs(doc), leastGPUs(s); least > held {
		t.Errorf("leastGPUs %d > the %d GPUs a valid placement holds: %s", least, held, placementOf(doc))
	}
	if o := WithinQuota(Outcome{Plan: doc}, s); o.Err != nil {
		t.Errorf("a plan holding %d GPUs within max_gpus %d refused: %v", HeldGPUs(doc), s.MaxGPUs, o.Err)
	}
}
