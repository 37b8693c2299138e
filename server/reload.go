package server

import (
	"context"
	"crypto/sha256"
	"os"
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
	var lastMod time.Time
	var lastSize int64 = -1
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(s.cfg.Rules)
		if err != nil {
			continue // a missing file is reported when it is reloaded
		}
		if fi.ModTime().Equal(lastMod) && fi.Size() == lastSize {
			continue
		}
		lastMod, lastSize = fi.ModTime(), fi.Size()
		data, err := os.ReadFile(s.cfg.Rules)
		if err != nil {
			continue
		}
		if sha256.Sum256(data) == s.lastHash() {
			continue
		}
		_ = s.Reload() // logged and counted by Reload
	}
}
