//go:build race

package envoy

// raceEnabled: the race detector is on, and sync.Pool drops some of what
// it is given, so allocation counts mean nothing.
const raceEnabled = true
