//go:build !race

package envoy

const raceEnabled = false
