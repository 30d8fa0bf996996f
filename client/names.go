// Package client follows and asks poolplanner over NATS: a plan's
// revisions, one node's assignments, lookups and validation, and any
// revision of a plan rebuilt from the stream and its snapshots. Launchers
// written in Go use it; its names and messages are those subjects.md
// documents for any NATS client.
package client

import "strings"

// Names fixed by the outside contract (docs/contract.md).
const (
	// InventoryBucket is the KV bucket of node inventories, key = node id.
	InventoryBucket = "poolplanner-inventory"
	// SpecBucket is the KV bucket of job specs, key = plan name.
	SpecBucket = "poolplanner-specs"
	// PlansStream is the stream of plan revisions, kept for audit.
	PlansStream = "POOLPLANNER_PLANS"
	// PlanSubjectPrefix prefixes the subject of plan NAME's revisions.
	PlanSubjectPrefix = "poolplanner.plans."
	// AssignmentSubjectPrefix prefixes poolplanner.assignments.NAME.NODE_ID,
	// one node's workers of plan NAME, kept last per subject.
	AssignmentSubjectPrefix = "poolplanner.assignments."
	// ServiceName is the micro service's name.
	ServiceName = "poolplanner"
	// ValidateSubject answers: is this job spec valid on the live
	// inventory.
	ValidateSubject = "poolplanner.validate"
	// LookupSubject answers: where does a worker (or a node's workers) go.
	LookupSubject = "poolplanner.lookup"
	// PlanSubject answers with a plan document (latest, or a revision).
	PlanSubject = "poolplanner.plan"
)

// Names of poolplanner's own, documented in subjects.md.
const (
	// AssignmentsStream keeps the last message of every assignment
	// subject.
	AssignmentsStream = "POOLPLANNER_ASSIGNMENTS"
	// PlansBucket is the object store of snapshots (revisions stored
	// whole) and of assignments too large for one message.
	PlansBucket = "poolplanner-plans"
	// RepliesBucket is the object store of replies too large for one
	// message; they expire after RepliesTTL.
	RepliesBucket = "poolplanner-replies"
	// DrainBucket is the KV bucket of drained nodes and GPUs (planner
	// drain): key node.NODE_ID or gpu.INDEX.NODE_ID, value a JSON drain.
	DrainBucket = "poolplanner-drains"
	// PlanRepublishPrefix prefixes poolplanner.planned.NAME, where the plan
	// stream republishes the headers of each event of plan NAME it
	// stores (the stream's RePublish): a follower that subscribes there
	// needs no consumer (FollowOptions.Republished).
	PlanRepublishPrefix = "poolplanner.planned."
)

// Message headers.
const (
	// PlanHeader, on a validate request, names the plan the spec is for:
	// that plan's own GPUs are not in its way (it would replace them).
	PlanHeader = "Poolplanner-Plan"
	// RevisionHeader carries a plan event's or assignment's revision.
	RevisionHeader = "Poolplanner-Revision"
	// BaseHeader carries the revision whose whole placement begins the
	// chain an event continues (plan.Event.Base).
	BaseHeader = "Poolplanner-Base"
	// KindHeader says how an event carries the placement: document,
	// change or snapshot (plan.Event.Kind).
	KindHeader = "Poolplanner-Kind"
	// ValidHeader, MovedHeader, ReasonHeader and ErrorHeader repeat the
	// event's valid, moved, reason and error, so that a history reads
	// headers only.
	ValidHeader  = "Poolplanner-Valid"
	MovedHeader  = "Poolplanner-Moved"
	ReasonHeader = "Poolplanner-Reason"
	ErrorHeader  = "Poolplanner-Error"
	// StateHeader repeats the event's state: valid, degraded (its
	// workers run, some are unplaced) or invalid (plan.Header.Status.State).
	// Events from before states have none: ValidHeader says.
	StateHeader = "Poolplanner-State"
	// SpecDigestHeader carries a digest of the spec a plan was made from.
	SpecDigestHeader = "Poolplanner-Spec-Digest"
	// PlacedForHeader, on a revision whose spec is pending, carries the
	// digest of the spec its placement follows (the last one in force):
	// a planner restarted on it re-checks the placement on that spec.
	PlacedForHeader = "Poolplanner-Placed-For"
	// SpecRevisionHeader carries the spec bucket revision of the spec a
	// plan was made from: a planner restarted on it tells from the spec's
	// history whether the spec was removed after (and stored again while
	// no planner ran). Absent on events from before planners said it.
	SpecRevisionHeader = "Poolplanner-Spec-Revision"
	// PlannerHeader names the planner instance that published an event.
	PlannerHeader = "Poolplanner-Planner"
)

// PlanEventSubject is the subject plan name's revisions are published on.
func PlanEventSubject(name string) string { return PlanSubjectPrefix + name }

// AssignmentSubject is the subject of node's workers of plan name.
func AssignmentSubject(name, node string) string {
	return AssignmentSubjectPrefix + name + "." + node
}

// AssignmentNode is the node id of an assignment subject of plan name,
// or "" when subject is not one.
func AssignmentNode(name, subject string) string {
	node, _ := strings.CutPrefix(subject, AssignmentSubjectPrefix+name+".")
	if node == subject {
		return ""
	}
	return node
}
