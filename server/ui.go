package server

import (
	"embed"
	"io/fs"
	"net/http"
)

// The admin page, on the admin listener at /ui/: static files embedded
// in the binary (no framework, nothing loaded from elsewhere: the
// Content-Security-Policy says so to the browser). The files hold no
// data: the page asks the admin API for everything, with the admin token
// the user types in, as an Authorization header; so they are served
// without the token, but not at all when the server has none (as the
// admin API).

//go:embed ui/index.html ui/app.js ui/style.css
var uiFiles embed.FS

// uiPolicy allows the page its own files and its own origin's API only.
const uiPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (s *Server) uiHandler() http.Handler {
	sub, _ := fs.Sub(uiFiles, "ui")
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.AdminToken == "" {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "the admin page is off: start drip serve with --admin-token"})
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", uiPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
