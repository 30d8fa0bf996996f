package plan

import (
	"slices"
	"strings"
	"testing"
)

func TestCompareNodeIDs(t *testing.T) {
	ids := []string{"n10", "n9", "n1", "a", "n01", "n1b", "n1a", "m2", "sim3-gb200-18", "sim3-gb200-2", "sim3-gb200-10"}
	slices.SortFunc(ids, CompareNodeIDs)
	want := []string{"a", "m2", "n01", "n1", "n1a", "n1b", "n9", "n10", "sim3-gb200-2", "sim3-gb200-10", "sim3-gb200-18"}
	if !slices.Equal(ids, want) {
		t.Fatalf("sorted %v, want %v", ids, want)
	}
}

func TestFollows(t *testing.T) {
	cases := []struct {
		prev, next string
		want       bool
	}{
		{"sim-h100-2", "sim-h100-3", true},
		{"sim-h100-2", "sim-h100-4", false},
		{"node-009", "node-010", true},
		{"node-099", "node-100", true},
		{"node-99", "node-100", true},
		{"n9", "n10", true},
		{"node-09", "node-010", false},
		{"n1", "n02", false},
		{"rack1-tray18", "rack2-tray01", false},
		{"rack1-tray01", "rack1-tray02", true},
		{"gpu-7a", "gpu-8a", true},
		{"gpu-7a", "gpu-8b", false},
		{"a", "b", false},
		{"x1", "y2", false},
		{"n1", "n1", false},
	}
	for _, c := range cases {
		if got := Follows(c.prev, c.next); got != c.want {
			t.Errorf("Follows(%q, %q) = %v, want %v", c.prev, c.next, got, c.want)
		}
	}
}

func TestShortenIndex(t *testing.T) {
	var items []string
	for i := 0; i < 96; i += 4 {
		items = append(items, FormatRanges([]Range{{First: i, Last: i + 3}}))
	}
	long := strings.Join(items, ", ")
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"0-7, 8-15", 100, "0-7, 8-15"},
		{long, 100, "0-3, 4-7, 8-11, 12-15, 16-19, 20-23, 24-27, 28-31, ... (9 more), 68-71, 72-75, 76-79, 80-83, 84-87, 88-91, 92-95"},
		{long, 20, "0-3, 4-7, ... (21 more), 92-95"},
	}
	for _, c := range cases {
		got := ShortenIndex(c.in, c.n)
		if got != c.want {
			t.Errorf("ShortenIndex(%d bytes, %d) = %q, want %q", len(c.in), c.n, got, c.want)
		}
		// Every item shown is whole: one of the string's own.
		for _, it := range strings.Split(got, ", ") {
			if !strings.HasPrefix(it, "... (") && !slices.Contains(strings.Split(c.in, ", "), it) {
				t.Errorf("%q: item %q is cut", got, it)
			}
		}
	}
}
