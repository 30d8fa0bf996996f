package planner

// Pool names of auto mode, as in rlightning.
const (
	TrainPool   = "train_pool"
	RolloutPool = "rollout_pool"
	GlobalPool  = "global_pool"
)

// fillTrain places train workers on the GPUs gpus of ns, then reserves
// what is still owed to the buffer at the end of the train range, and
// returns how many GPUs of gpus the train range takes.
func (b *build) fillTrain(pool string, ns *nodeState, gpus []int) int {
	d := b.demands[0]
	t, _ := b.pk.fill(pool, ns, d, gpus)
	if d.done() && b.reserve > 0 {
		extra := min(len(gpus)-t, b.reserve)
		t += extra
		b.reserve -= extra
	}
	return t
}

// disaggregate gives train its own nodes and rollout (eval and env) the
// rest. rlightning's second pass walks the nodes in order and so puts
// rollout workers on a train node's leftover GPUs inside train_pool; here
// rollout takes the nodes train does not use first, and a train node's
// leftover only when it must, as a member of both pools.
func (b *build) disaggregate() {
	train, eval, env := b.demands[0], b.demands[1], b.demands[2]
	tp := b.pool(TrainPool)
	for _, ns := range b.states {
		if train.done() && b.reserve == 0 {
			break
		}
		free := ns.free()
		if len(free) == 0 {
			b.notes.add(ns.node.ID, Train, ReasonNoGPUs)
			continue
		}
		before := train.index
		t := b.fillTrain(TrainPool, ns, free)
		if t > 0 || train.index > before {
			tp.node(ns).alloc[0] = free[:t]
			ns.cursor += t
		}
	}
	order := make([]*nodeState, 0, len(b.states))
	for _, ns := range b.states {
		if tp.has(ns) == nil {
			order = append(order, ns)
		}
	}
	for _, pn := range tp.nodes {
		order = append(order, pn.ns)
	}
	rp := b.pool(RolloutPool)
	colo := b.spec.Placement.EnvStrategy == EnvStrategyDeviceColocate
	for _, ns := range order {
		if eval.done() && env.done() {
			break
		}
		free := ns.free()
		if len(free) == 0 {
			continue
		}
		before := eval.index + env.index
		e, _ := b.pk.fill(RolloutPool, ns, eval, free)
		off := e
		if colo {
			off = 0
		}
		v, _ := b.pk.fill(RolloutPool, ns, env, free[off:])
		if e+v > 0 || eval.index+env.index > before {
			pn := rp.node(ns)
			pn.alloc[1] = free[:e]
			pn.alloc[2] = free[off : off+v]
			ns.cursor += max(e, off+v)
		}
	}
}

// colocate puts every component in one global_pool: train overlaps the
// rollout GPUs of a node; eval and env share GPUs under device-colocate
// and follow one another otherwise. rlightning sizes env by the GPUs the
// node had before eval took its share, and so can ask for GPUs the node no
// longer has; here env takes only what eval left.
func (b *build) colocate() {
	train, eval, env := b.demands[0], b.demands[1], b.demands[2]
	gp := b.pool(GlobalPool)
	colo := b.spec.Placement.EnvStrategy == EnvStrategyDeviceColocate
	for _, ns := range b.states {
		if train.done() && eval.done() && env.done() && b.reserve == 0 {
			break
		}
		free := ns.free()
		if len(free) == 0 {
			continue
		}
		before := train.index + eval.index + env.index
		t := b.fillTrain(GlobalPool, ns, free)
		e, _ := b.pk.fill(GlobalPool, ns, eval, free)
		off := e
		if colo {
			off = 0
		}
		v, _ := b.pk.fill(GlobalPool, ns, env, free[off:])
		if t+e+v > 0 || train.index+eval.index+env.index > before {
			pn := gp.node(ns)
			pn.alloc[0] = free[:t]
			pn.alloc[1] = free[:e]
			pn.alloc[2] = free[off : off+v]
			ns.cursor += max(t, e, off+v)
		}
	}
}
