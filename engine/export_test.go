package engine

// RaceEnabled is raceEnabled, for the tests of package engine_test.
const RaceEnabled = raceEnabled
