package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/poolplanner/poolplanner/internal/planner"
)

// Names of the plan stream and spec bucket that the contract leaves to us;
// subjects.md documents them.
const (
	// SpecBucket is the KV bucket of job specs, key = plan name. A spec
	// change is a new revision of its key.
	SpecBucket = "poolplanner-specs"
	// RevisionHeader carries a plan message's revision, so that readers
	// can find a revision without decoding every document.
	RevisionHeader = "Poolplanner-Revision"
	// SpecDigestHeader carries a digest of the spec a plan was made from;
	// a planner compares it with the current spec to tell a spec change
	// from an inventory change, across restarts.
	SpecDigestHeader = "Poolplanner-Spec-Digest"
	// PlannerHeader names the planner instance that published a plan, so
	// that it can skip its own plans when it follows the stream.
	PlannerHeader = "Poolplanner-Planner"
	// PlanHistory is how many specs per plan name the spec bucket keeps.
	SpecHistory = 64
	// PlanDuplicateWindow is how long JetStream remembers message ids, so
	// that a retried publish of the same revision is stored once.
	PlanDuplicateWindow = 2 * time.Minute
)

// ErrConflict is returned by PlanStore.Publish when another planner
// published to the plan first: re-read the latest and recompute.
var ErrConflict = errors.New("plan history moved on")

// PlansStreamConfig is the plan stream's settings: every version of every
// plan kept on file, for audit.
func PlansStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              PlansStream,
		Description:       "poolplanner plan versions, subject = poolplanner.plans.NAME",
		Subjects:          []string{PlanSubjectPrefix + ">"},
		Storage:           jetstream.FileStorage,
		MaxMsgsPerSubject: -1,
		Duplicates:        PlanDuplicateWindow,
	}
}

// SpecBucketConfig is the spec bucket's settings.
func SpecBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      SpecBucket,
		Description: "poolplanner job specs, key = plan name",
		History:     SpecHistory,
		Storage:     jetstream.FileStorage,
	}
}

// StoredPlan is a plan as the stream holds it.
type StoredPlan struct {
	Plan *planner.Plan
	// Seq is the stream sequence, the value to expect on the next publish.
	Seq        uint64
	SpecDigest string
}

// PlanStore reads and writes the plan stream.
type PlanStore struct {
	js jetstream.JetStream
	// Publisher, when set, goes out in PlannerHeader with every plan.
	Publisher string
}

// NewPlanStore returns a store over js; Ensure creates the stream.
func NewPlanStore(js jetstream.JetStream) *PlanStore { return &PlanStore{js: js} }

// Ensure creates the plan stream if it is missing.
func (s *PlanStore) Ensure(ctx context.Context) error {
	if _, err := s.js.CreateOrUpdateStream(ctx, PlansStreamConfig()); err != nil {
		return fmt.Errorf("ensure stream %s: %w", PlansStream, err)
	}
	return nil
}

// Latest returns the newest version of plan name; nil and no error when
// the plan has none yet.
func (s *PlanStore) Latest(ctx context.Context, name string) (*StoredPlan, error) {
	st, err := s.js.Stream(ctx, PlansStream)
	if err != nil {
		return nil, fmt.Errorf("latest plan %s: %w", name, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, PlanVersionSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("latest plan %s: %w", name, err)
	}
	return decodeStored(m.Data, m.Header, m.Sequence)
}

func decodeStored(data []byte, h nats.Header, seq uint64) (*StoredPlan, error) {
	var p planner.Plan
	if err := DecodeJSON(data, h, &p); err != nil {
		return nil, fmt.Errorf("plan at sequence %d: %w", seq, err)
	}
	return &StoredPlan{Plan: &p, Seq: seq, SpecDigest: h.Get(SpecDigestHeader)}, nil
}

// Publish appends p as the next version of its plan, only if the last
// version on the subject is still at sequence expect (0: none yet). The
// message id is NAME:REVISION, so a retried publish is stored once and a
// second planner's revision N is refused. It returns ErrConflict when the
// history moved on.
func (s *PlanStore) Publish(ctx context.Context, p *planner.Plan, specDigest string, expect uint64) (uint64, error) {
	data, h, err := EncodeJSON(p)
	if err != nil {
		return 0, fmt.Errorf("publish plan %s: %w", p.Name, err)
	}
	if err := checkPayload(s.js.Conn(), fmt.Sprintf("plan %s revision %d", p.Name, p.Revision), len(data)); err != nil {
		return 0, fmt.Errorf("publish plan %s: %w", p.Name, err)
	}
	if h == nil {
		h = nats.Header{}
	}
	msg := &nats.Msg{Subject: PlanVersionSubject(p.Name), Header: h, Data: data}
	msg.Header.Set(RevisionHeader, strconv.Itoa(p.Revision))
	msg.Header.Set(SpecDigestHeader, specDigest)
	if s.Publisher != "" {
		msg.Header.Set(PlannerHeader, s.Publisher)
	}
	ack, err := s.js.PublishMsg(ctx, msg,
		jetstream.WithExpectLastSequencePerSubject(expect),
		jetstream.WithMsgID(p.Name+":"+strconv.Itoa(p.Revision)))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return 0, fmt.Errorf("publish plan %s revision %d: %w", p.Name, p.Revision, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("publish plan %s revision %d: %w", p.Name, p.Revision, err)
	}
	if ack.Duplicate {
		// Someone stored this revision first, with other content.
		return 0, fmt.Errorf("publish plan %s revision %d: duplicate: %w", p.Name, p.Revision, ErrConflict)
	}
	return ack.Sequence, nil
}

// History calls fn with every stored version of plan name, oldest first,
// until fn returns false.
func (s *PlanStore) History(ctx context.Context, name string, fn func(*StoredPlan) bool) error {
	st, err := s.js.Stream(ctx, PlansStream)
	if err != nil {
		return fmt.Errorf("plan history %s: %w", name, err)
	}
	last, err := st.GetLastMsgForSubject(ctx, PlanVersionSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("plan history %s: %w", name, err)
	}
	cons, err := s.js.OrderedConsumer(ctx, PlansStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{PlanVersionSubject(name)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("plan history %s: %w", name, err)
	}
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("plan history %s: %w", name, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("plan history %s: %w", name, err)
			}
			sp, err := decodeStored(m.Data(), m.Headers(), md.Sequence.Stream)
			if err != nil {
				return fmt.Errorf("plan history %s: %w", name, err)
			}
			if !fn(sp) || md.Sequence.Stream >= last.Sequence {
				return nil
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("plan history %s: %w", name, err)
		}
		if n == 0 {
			return fmt.Errorf("plan history %s: stream ended before sequence %d", name, last.Sequence)
		}
	}
}

// Revision returns version rev of plan name, or ErrNotFound.
func (s *PlanStore) Revision(ctx context.Context, name string, rev int) (*StoredPlan, error) {
	var found *StoredPlan
	err := s.History(ctx, name, func(sp *StoredPlan) bool {
		if sp.Plan.Revision == rev {
			found = sp
			return false
		}
		return sp.Plan.Revision < rev
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("plan %s revision %d: %w", name, rev, ErrNotFound)
	}
	return found, nil
}

// Follow delivers the latest version of plan name and then every new one,
// until ctx is done; the channel is then closed. It survives reconnects.
func (s *PlanStore) Follow(ctx context.Context, name string) (<-chan *StoredPlan, error) {
	return s.FollowUnknown(ctx, name, nil)
}

// FollowUnknown is Follow for a reader that already holds some versions:
// messages for which known (given the stream sequence and the headers)
// returns true are skipped undecoded. A planner that published a plan need not decode it again,
// which at thousands of workers costs more than making it.
func (s *PlanStore) FollowUnknown(ctx context.Context, name string, known func(seq uint64, h nats.Header) bool) (<-chan *StoredPlan, error) {
	cons, err := s.js.OrderedConsumer(ctx, PlansStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{PlanVersionSubject(name)},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow plan %s: %w", name, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("follow plan %s: %w", name, err)
	}
	out := make(chan *StoredPlan, 16)
	ended := stopOnDone(ctx, it.Stop)
	go func() {
		defer close(out)
		defer close(ended)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			md, err := m.Metadata()
			if err != nil || (known != nil && known(md.Sequence.Stream, m.Headers())) {
				continue
			}
			sp, err := decodeStored(m.Data(), m.Headers(), md.Sequence.Stream)
			if err != nil {
				continue
			}
			select {
			case out <- sp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// SpecStore reads and writes the spec bucket.
type SpecStore struct {
	js jetstream.JetStream
}

// NewSpecStore returns a store over js.
func NewSpecStore(js jetstream.JetStream) *SpecStore { return &SpecStore{js: js} }

// KV creates the bucket if missing and returns it.
func (s *SpecStore) KV(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, SpecBucketConfig())
	if err != nil {
		return nil, fmt.Errorf("ensure bucket %s: %w", SpecBucket, err)
	}
	return kv, nil
}

// Put stores spec (YAML or JSON) as plan name's spec, after checking that
// it parses; it returns the key's revision.
func (s *SpecStore) Put(ctx context.Context, name string, spec []byte) (uint64, error) {
	if _, err := planner.ParseSpec(spec); err != nil {
		return 0, fmt.Errorf("%w: spec: %w", ErrBadRequest, err)
	}
	if err := ValidatePlanName(name); err != nil {
		return 0, err
	}
	kv, err := s.KV(ctx)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, name, spec)
	if err != nil {
		return 0, fmt.Errorf("put spec %s: %w", name, err)
	}
	return rev, nil
}

// Get returns plan name's current spec, or ErrNotFound.
func (s *SpecStore) Get(ctx context.Context, name string) ([]byte, uint64, error) {
	kv, err := s.KV(ctx)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, fmt.Errorf("spec %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("get spec %s: %w", name, err)
	}
	return e.Value(), e.Revision(), nil
}

// ValidatePlanName checks that name can be a subject token and a KV key.
func ValidatePlanName(name string) error {
	if name == "" || !keyRE.MatchString(name) || containsAny(name, "./") {
		return fmt.Errorf("%w: plan name %q: use letters, digits, - _ =", ErrBadRequest, name)
	}
	return nil
}

func containsAny(s, chars string) bool {
	for _, c := range chars {
		for _, x := range s {
			if x == c {
				return true
			}
		}
	}
	return false
}
