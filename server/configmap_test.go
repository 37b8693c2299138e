package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/driplimit/drip/store/memstore"
)

// configMapDir is a directory laid out as the kubelet lays out a mounted
// ConfigMap: the files live in a hidden directory named by a timestamp,
// "..data" links to it, and each visible name links to "..data/name".
// An update writes a new hidden directory, swaps "..data" to it in one
// rename, and removes the old one.
type configMapDir struct {
	t   *testing.T
	dir string
	gen int
	cur string // the hidden directory "..data" points at
}

func newConfigMapDir(t *testing.T, files map[string]string) *configMapDir {
	c := &configMapDir{t: t, dir: t.TempDir()}
	c.update(files, nil)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(c.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// update swaps in files as the kubelet does. With sameStat each new file
// gets the size and modification time of the file it replaces, so that
// only its content and the link target tell them apart.
func (c *configMapDir) update(files map[string]string, sameStat map[string]bool) {
	c.t.Helper()
	c.gen++
	next := fmt.Sprintf("..2026_11_23_00_00_%02d.%d", c.gen, 1000+c.gen)
	if err := os.Mkdir(filepath.Join(c.dir, next), 0o755); err != nil {
		c.t.Fatal(err)
	}
	for name, body := range files {
		p := filepath.Join(c.dir, next, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			c.t.Fatal(err)
		}
		if sameStat[name] {
			old, err := os.Stat(filepath.Join(c.dir, c.cur, name))
			if err != nil {
				c.t.Fatal(err)
			}
			if old.Size() != int64(len(body)) {
				c.t.Fatalf("%s: the new content is %d bytes, the old %d: not the same size", name, len(body), old.Size())
			}
			if err := os.Chtimes(p, old.ModTime(), old.ModTime()); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(next, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
	if c.cur != "" {
		if err := os.RemoveAll(filepath.Join(c.dir, c.cur)); err != nil {
			c.t.Fatal(err)
		}
	}
	c.cur = next
}

// TestReloadConfigMapSwap: rules mounted from a Kubernetes ConfigMap are
// reloaded when the kubelet swaps them in, whether --rules names the
// mounted directory or the file in it, and even when the new file has the
// old one's size and modification time.
func TestReloadConfigMapSwap(t *testing.T) {
	rule := func(name string, burst int) string {
		return fmt.Sprintf(`{"name": %q, "limit_keys": ["header:x-api-key"], "algorithm_config": {"rate": 1, "period": "1h", "burst": %d}}`, name, burst)
	}
	file := func(rules ...string) string { return `{"rules": [` + strings.Join(rules, ", ") + `]}` }
	for _, target := range []string{"directory", "file"} {
		t.Run(target, func(t *testing.T) {
			cm := newConfigMapDir(t, map[string]string{"rules.json": file(rule("api", 5))})
			path := cm.dir
			if target == "file" {
				path = filepath.Join(cm.dir, "rules.json")
			}
			srv := start(t, Config{Rules: path, WatchEvery: 5 * time.Millisecond}, memstore.New())
			waitPeek := func(rule, want string) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for {
					code, out := post(t, srv.base+"/v1/peek", `{"rule": "`+rule+`", "values": ["k"]}`)
					if code == 200 && strings.Contains(out, want) {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("the swapped ConfigMap was not reloaded: peek %s answers %d %s, want %s", rule, code, out, want)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			waitPeek("api", `"limit":5`)

			cm.update(map[string]string{"rules.json": file(rule("api", 5), rule("added", 3))}, nil)
			waitPeek("added", `"limit":3`)

			cm.update(map[string]string{"rules.json": file(rule("api", 5), rule("added", 4))}, map[string]bool{"rules.json": true})
			waitPeek("added", `"limit":4`)
		})
	}
}
