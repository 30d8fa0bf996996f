//go:build !race

package service

// raceEnabled: built with -race.
const raceEnabled = false
