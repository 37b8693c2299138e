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
	t := time.NewTicker(s.cfg.WatchEvery)
	defer t.Stop()
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sig, err := rulesStat(s.cfg.Rules, s.cfg.Envoy) // a file or a directory's files (envoy.go)
		if err != nil {
			continue // a missing file is reported when it is reloaded
		}
		if sig == last {
			continue
		}
		last = sig
		_, hash, err := readRuleFiles(s.cfg.Rules, s.cfg.Envoy)
		if err != nil || hash == s.lastHash() {
			continue
		}
		_ = s.Reload() // logged and counted by Reload
	}
}
