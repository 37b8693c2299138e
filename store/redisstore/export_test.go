package redisstore

// Running is the number of batch calls in flight (0 without batching).
func Running(s *Store) int {
	if s.batch == nil {
		return 0
	}
	return s.batch.Running()
}

// ScriptFailed is scriptFailed, for the tests of what it tells apart.
var ScriptFailed = scriptFailed

// Queued is the number of requests waiting for a batch (0 without
// batching).
func Queued(s *Store) int {
	if s.batch == nil {
		return 0
	}
	return s.batch.Queued()
}
