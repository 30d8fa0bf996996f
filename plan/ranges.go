package plan

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Range is an inclusive range of GPU indices, [First, Last].
type Range struct {
	First, Last int
}

// Len is the number of GPUs in the range.
func (r Range) Len() int { return r.Last - r.First + 1 }

func (r Range) String() string {
	if r.First == r.Last {
		return strconv.Itoa(r.First)
	}
	return strconv.Itoa(r.First) + "-" + strconv.Itoa(r.Last)
}

// MarshalJSON writes a range as the contract's [first, last] pair.
func (r Range) MarshalJSON() ([]byte, error) {
	return []byte("[" + strconv.Itoa(r.First) + "," + strconv.Itoa(r.Last) + "]"), nil
}

// FormatRanges writes ranges as rlightning's index string: "0-7, 8-15", a
// single GPU as "5".
func FormatRanges(rs []Range) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.String())
	}
	return b.String()
}

// ParseIndexString reads an rlightning index string ("0-3, 8, 9-11"). As in
// rlightning a reversed range ("7-0") is read as its normal form and an
// empty string gives no ranges.
func ParseIndexString(s string) ([]Range, error) {
	var out []Range
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		a, b, isRange := strings.Cut(part, "-")
		first, err1 := parseIndex(a)
		last := first
		var err2 error
		if isRange {
			last, err2 = parseIndex(b)
		}
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("malformed index string %q at %q; want GPU indices or ranges such as \"0-7, 8-15\"", s, part)
		}
		if last < first {
			first, last = last, first
		}
		out = append(out, Range{first, last})
	}
	return out, nil
}

func parseIndex(s string) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.ContainsAny(s, "+-") {
		return 0, fmt.Errorf("bad index %q", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > 1<<30 {
		return 0, fmt.Errorf("bad index %q", s)
	}
	return n, nil
}

// RangesOf compresses GPU indices, in the order given, into ranges of
// consecutive indices.
func RangesOf(gpus []int) []Range { return appendRanges(nil, gpus) }

// appendRanges appends the ranges of gpus to out, never merging with what
// out already holds.
func appendRanges(out []Range, gpus []int) []Range {
	base := len(out)
	for _, g := range gpus {
		if n := len(out); n > base && out[n-1].Last+1 == g {
			out[n-1].Last = g
			continue
		}
		out = append(out, Range{g, g})
	}
	return out
}

// UnmarshalJSON reads the [first, last] pair MarshalJSON writes.
func (r *Range) UnmarshalJSON(b []byte) error {
	var pair []int
	if err := json.Unmarshal(b, &pair); err != nil || len(pair) != 2 {
		return fmt.Errorf("range %s: want [first, last]", b)
	}
	r.First, r.Last = pair[0], pair[1]
	return nil
}
