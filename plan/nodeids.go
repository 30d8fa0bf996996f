package plan

import (
	"cmp"
	"strconv"
	"strings"
)

// Node ids as a person reads them: the views that fold runs of alike
// nodes into one line ("sim-h100-2 .. sim-h100-4 (3 nodes)": the text
// map, the web map, planner status) order ids with CompareNodeIDs and
// fold only ids that Follow one another, so that a run's name says
// exactly which nodes it holds and its count matches.

// CompareNodeIDs orders node ids as a person counts: the digits in them
// as numbers (node-2 before node-10), the rest as text; ids that differ
// only in zeros before a number ("n01", "n1") by their text.
func CompareNodeIDs(a, b string) int {
	x, y := a, b
	for x != "" && y != "" {
		dx, dy := digitsAt(x), digitsAt(y)
		if dx > 0 && dy > 0 {
			nx, ny := strings.TrimLeft(x[:dx], "0"), strings.TrimLeft(y[:dy], "0")
			if c := cmp.Or(cmp.Compare(len(nx), len(ny)), strings.Compare(nx, ny)); c != 0 {
				return c
			}
			x, y = x[dx:], y[dy:]
			continue
		}
		if x[0] != y[0] {
			return cmp.Compare(x[0], y[0])
		}
		x, y = x[1:], y[1:]
	}
	return cmp.Or(cmp.Compare(len(x), len(y)), strings.Compare(a, b))
}

// Follows reports whether id next comes right after id prev in a
// numbered series: they are alike but for their last number, which is
// one more in next, written the same way (as wide when zero-padded:
// "node-009", "node-010"; else as it falls: "n9", "n10"). Ids without a
// number follow nothing.
func Follows(prev, next string) bool {
	ps, pn, pe, ok1 := lastNumber(prev)
	ns, nn, ne, ok2 := lastNumber(next)
	if !ok1 || !ok2 || prev[:ps] != next[:ns] || prev[pe:] != next[ne:] {
		return false
	}
	a, err1 := strconv.ParseUint(pn, 10, 64)
	b, err2 := strconv.ParseUint(nn, 10, 64)
	if err1 != nil || err2 != nil || a == ^uint64(0) || b != a+1 { // no id follows the largest
		return false
	}
	padded := len(pn) > 1 && pn[0] == '0' || len(nn) > 1 && nn[0] == '0'
	if padded {
		return len(pn) == len(nn)
	}
	return nn == strconv.FormatUint(b, 10) && pn == strconv.FormatUint(a, 10)
}

// lastNumber finds the last run of digits in s: where it starts, the
// digits, and where it ends.
func lastNumber(s string) (start int, digits string, end int, ok bool) {
	end = len(s)
	for end > 0 && !isDigit(s[end-1]) {
		end--
	}
	if end == 0 {
		return 0, "", 0, false
	}
	start = end
	for start > 0 && isDigit(s[start-1]) {
		start--
	}
	return start, s[start:end], end, true
}

// digitsAt is how many digits s begins with.
func digitsAt(s string) int {
	n := 0
	for n < len(s) && isDigit(s[n]) {
		n++
	}
	return n
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// ShortenIndex shortens an index string ("0-3, 4-7, 8-11, ...") to about
// n bytes for a person to read, cutting only between whole items: the
// first and last items that fit, taken from either end in turn, and
// "... (K more)" between them.
func ShortenIndex(s string, n int) string {
	if len(s) <= n {
		return s
	}
	items := strings.Split(s, ", ")
	head, tail, used := 0, 0, 0
	// Whole items from either end in turn, while they fit in n.
	for fits := true; fits && head+tail < len(items); {
		fits = false
		if it := items[head]; used+len(it)+2 <= n && head+tail < len(items) {
			used, head, fits = used+len(it)+2, head+1, true
		}
		if it := items[len(items)-1-tail]; used+len(it)+2 <= n && head+tail < len(items) {
			used, tail, fits = used+len(it)+2, tail+1, true
		}
	}
	hidden := len(items) - head - tail
	if hidden <= 0 {
		return s
	}
	parts := append(append([]string{}, items[:head]...), "... ("+strconv.Itoa(hidden)+" more)")
	return strings.Join(append(parts, items[len(items)-tail:]...), ", ")
}
