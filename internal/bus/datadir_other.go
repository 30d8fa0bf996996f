//go:build !unix

package bus

import "os"

// Without flock the directory is not locked: one server per directory is
// then the operator's to keep.
func lockFile(*os.File) error { return nil }

func unlockFile(*os.File) error { return nil }
