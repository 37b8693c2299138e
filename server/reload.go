package server

import (
	"context"
	"time"
)

// watch polls the rules file every Config.WatchEvery and reloads when its
// content changes. Polling (a stat, and a hash when size or mtime moved)
// needs no dependency and works on every file system, including the
// symlink swaps of Kubernetes ConfigMaps.
func (s *Server) watch(ctx context.Context) {
	if s.cfg.Rules == "" || s.cfg.WatchEvery < 0 {
		return
	}
	tick := s.watchTick
	if tick == nil {
		t := time.NewTicker(s.cfg.WatchEvery)
		defer t.Stop()
		tick = t.C
	}
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		last = s.poll(last)
		if s.watchPolled != nil {
			s.watchPolled()
		}
	}
}

// poll reloads the rules if their files changed since the signature last
// (of rulesStat), and returns the files' signature now.
func (s *Server) poll(last string) string {
	sig, err := rulesStat(s.cfg.Rules, s.cfg.Envoy) // a file or a directory's files (envoy.go)
	if err != nil {
		return last // a missing file is reported when it is reloaded
	}
	if sig == last {
		return last
	}
	_, hash, err := readRuleFiles(s.cfg.Rules, s.cfg.Envoy)
	if err != nil || hash == s.lastHash() {
		return sig
	}
	_ = s.Reload() // logged and counted by Reload
	return sig
}
