package inventory

import (
	"maps"
	"slices"
	"testing"
)

// TestIgnoredXIDsAreTheCatalogs: the reporter's --xid-ignore default
// (DefaultIgnoredXIDs) and the catalog's application faults are one
// list, so a reporter given no list and one given the default agree.
func TestIgnoredXIDsAreTheCatalogs(t *testing.T) {
	var ignored []uint64
	for _, code := range slices.Sorted(maps.Keys(xidCatalog)) {
		if xidCatalog[code] == XIDIgnore {
			ignored = append(ignored, code)
		}
	}
	if got := slices.Sorted(slices.Values(DefaultIgnoredXIDs)); !slices.Equal(got, ignored) {
		t.Fatalf("DefaultIgnoredXIDs %v, the catalog ignores %v", got, ignored)
	}
}
