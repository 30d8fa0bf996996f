package wire

import (
	"strconv"
	"strings"
)

// SnapshotObject names an object holding revision rev of plan name
// whole, in the plans bucket; id tells apart the snapshots two planners
// racing to publish rev store (only one's event names its own). Readers
// take the name from the event.
func SnapshotObject(name string, rev int, id string) string {
	return SnapshotPrefix(name) + strconv.Itoa(rev) + "/" + id
}

// SnapshotPrefix begins the name of every snapshot object of plan name.
func SnapshotPrefix(name string) string { return name + "/snapshots/" }

// SnapshotRevision is the revision a snapshot object of plan name holds;
// false when object is not one.
func SnapshotRevision(name, object string) (int, bool) {
	rest, ok := strings.CutPrefix(object, SnapshotPrefix(name))
	if !ok {
		return 0, false
	}
	rev, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(rev)
	return n, err == nil
}

// AssignmentObject names an object holding node's workers of plan name
// when they are too many for one message, in the plans bucket; id makes
// each one's name new, so that a message never points at another's
// object.
func AssignmentObject(name, node, id string) string {
	return AssignmentObjectPrefix(name, node) + id
}

// AssignmentObjectPrefix begins the names of node's assignment objects of
// plan name. "@" cannot be in a node id, so no node's prefix begins
// another's (node ids may hold "/").
func AssignmentObjectPrefix(name, node string) string {
	return name + "/assignments/" + node + "@"
}

// ReplyObjectPrefix begins the names of reply objects in the replies
// bucket.
const ReplyObjectPrefix = "reply/"

// SummaryObject names the object, in the plans bucket, holding the
// summary (plan.Summary) of plan name's latest revision: one per plan,
// replaced with every revision, so readers match its seq to the latest
// event's. No snapshot or assignment name is it ("summary" is neither
// "snapshots/" nor "assignments/").
func SummaryObject(name string) string { return name + "/summary" }
