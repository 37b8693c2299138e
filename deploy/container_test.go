// Package deploy_test checks the container image without a container
// engine: the files in deploy/ and the Dockerfile at the root.
package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/driplimit/drip/internal/testkit/testserver"
)

// instruction is one line of a Dockerfile, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY...
	args string
}

// dockerStages reads a Dockerfile into its stages, each starting with its
// FROM.
func dockerStages(t *testing.T, path string) [][]instruction {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]instruction
	var line string
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSpace(l)
		if line == "" && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if cont, ok := strings.CutSuffix(l, `\`); ok {
			line += cont + " "
			continue
		}
		line += l
		cmd, args, _ := strings.Cut(line, " ")
		line = ""
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %s before the first FROM", path, in.cmd)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages
}

// TestContainer builds the binary the Dockerfile builds, with the same
// make target, and runs it as the image would: in an empty root holding
// only the files the image's last stage copies, as its numeric USER, with
// its ENV and ENTRYPOINT. /healthz answering proves the binary needs
// nothing from a base image. The listen addresses keep the image's host
// (every interface) with port 0, so that the test takes free ports.
func TestContainer(t *testing.T) {
	stages := dockerStages(t, filepath.Join("..", "Dockerfile"))
	if len(stages) != 2 {
		t.Fatalf("Dockerfile: %d stages, want a build stage and the image", len(stages))
	}
	build, image := stages[0], stages[1]
	from := strings.Fields(build[0].args)
	if len(from) != 3 || !strings.EqualFold(from[1], "AS") {
		t.Fatalf("Dockerfile: build stage %q: want FROM image AS name", build[0].args)
	}
	stage := from[2]
	// The builder's Go is the one go.mod asks for.
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go ([0-9]+\.[0-9]+)`).FindSubmatch(mod)
	if goVersion == nil {
		t.Fatal("go.mod: no go directive")
	}
	if from[0] != "golang:"+string(goVersion[1]) {
		t.Fatalf("Dockerfile: the build stage is FROM %s, want golang:%s as go.mod says", from[0], goVersion[1])
	}

	// The build: make static, whose OUT the image copies.
	var out string
	for _, in := range build {
		if in.cmd != "RUN" || !strings.HasPrefix(in.args, "make static") {
			continue
		}
		for _, f := range strings.Fields(in.args) {
			if v, ok := strings.CutPrefix(f, "OUT="); ok {
				out = v
			}
		}
	}
	if out == "" {
		t.Fatal("Dockerfile: the build stage does not RUN make static OUT=...")
	}

	// The image: FROM scratch, then only files copied from the build.
	if image[0].args != "scratch" {
		t.Fatalf("Dockerfile: the image is FROM %s, want scratch", image[0].args)
	}
	copies := map[string]string{} // image path -> build stage path
	env := map[string]string{}
	var uid, gid int
	var expose []string
	var entrypoint []string
	for _, in := range image[1:] {
		f := strings.Fields(in.args)
		switch in.cmd {
		case "COPY":
			if len(f) != 3 || f[0] != "--from="+stage {
				t.Fatalf("Dockerfile: COPY %s: want COPY --from=%s src dst", in.args, stage)
			}
			copies[f[2]] = f[1]
		case "ENV":
			for _, kv := range f {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("Dockerfile: ENV %s: want NAME=value pairs", in.args)
				}
				env[k] = v
			}
		case "USER":
			u, g, _ := strings.Cut(in.args, ":")
			var err1, err2 error
			uid, err1 = strconv.Atoi(u)
			gid, err2 = strconv.Atoi(g)
			if err1 != nil || err2 != nil || uid == 0 || gid == 0 {
				t.Fatalf("Dockerfile: USER %s: want a numeric non-root uid:gid (scratch has no /etc/passwd)", in.args)
			}
		case "EXPOSE":
			expose = append(expose, f...)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entrypoint); err != nil || len(entrypoint) == 0 {
				t.Fatalf("Dockerfile: ENTRYPOINT %s: want the exec form, a JSON list", in.args)
			}
		case "CMD", "ARG", "LABEL", "WORKDIR":
		default:
			t.Fatalf("Dockerfile: the image stage has %s %s: only COPY, ENV, USER, EXPOSE, ENTRYPOINT expected", in.cmd, in.args)
		}
	}
	if uid == 0 {
		t.Fatal("Dockerfile: no USER: the image would run as root")
	}
	if !slices.Equal(entrypoint, []string{"/drip", "serve"}) || copies["/drip"] != out {
		t.Fatalf("Dockerfile: ENTRYPOINT %q and COPY of %s to /drip (%q): want /drip serve, the built binary", entrypoint, out, copies["/drip"])
	}
	const certs = "/etc/ssl/certs/ca-certificates.crt"
	if copies[certs] != certs {
		t.Fatalf("Dockerfile: the image has no %s", certs)
	}
	if copies["/bin/ratelimit"] != out { // Envoy Gateway's command (docs/envoy.md)
		t.Fatalf("Dockerfile: no COPY of %s to /bin/ratelimit", out)
	}
	if len(copies) != 3 {
		t.Fatalf("Dockerfile: the image copies %v: want the binary (as /drip and /bin/ratelimit) and the CA certificates only", copies)
	}
	for _, name := range []string{"DRIP_LISTEN", "DRIP_ADMIN_LISTEN"} {
		host, port, ok := strings.Cut(env[name], ":")
		if !ok || host != "0.0.0.0" || !slices.Contains(expose, port) {
			t.Fatalf("Dockerfile: ENV %s=%q: want 0.0.0.0:port with the port in EXPOSE %v", name, env[name], expose)
		}
		env[name] = host + ":0"
	}

	// Building and running as another user in a chroot needs root.
	if os.Geteuid() != 0 {
		testserver.Missing(t, "the container test chroots and changes user: run it as root")
	}
	if _, err := exec.LookPath("make"); err != nil {
		testserver.Missing(t, "make: %v", err)
	}
	hostCerts, err := os.ReadFile(certs)
	if err != nil {
		testserver.Missing(t, "CA certificates: %v", err)
	}
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-10*time.Second))
		defer cancel()
	}
	root := filepath.Join(t.TempDir(), "root")
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	mk := exec.CommandContext(ctx, "make", "-C", repo, "static", "OUT="+filepath.Join(root, "drip"))
	if b, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make static: %v\n%s", err, b)
	}
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(certs)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, certs), hostCerts, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{root, filepath.Join(root, "etc"), filepath.Join(root, "etc", "ssl")} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.Command(entrypoint[0], entrypoint[1:]...)
	cmd.Dir = "/"
	// The image's environment, and a drain longer than the test, which
	// the test ends with a second SIGTERM.
	cmd.Env = []string{"DRIP_DRAIN=10m"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     root,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); errors.Is(err, syscall.EPERM) {
		testserver.Missing(t, "chroot or setuid refused (a container without CAP_SYS_CHROOT or CAP_SETUID?): %v", err)
	} else if err != nil {
		t.Fatalf("starting /drip serve in the empty root: %v", err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	// Its banner says where it listens (every interface: 0.0.0.0 or [::]).
	apiRe := regexp.MustCompile(`decision API on http://(?:0\.0\.0\.0|\[::\]):([0-9]+)`)
	adminRe := regexp.MustCompile(`metrics on http://(?:0\.0\.0\.0|\[::\]):([0-9]+)/metrics`)
	ports := make(chan [2]string, 1)
	go func() {
		var api, admin string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := apiRe.FindStringSubmatch(sc.Text()); m != nil {
				api = m[1]
			}
			if m := adminRe.FindStringSubmatch(sc.Text()); m != nil {
				admin = m[1]
			}
			if api != "" && admin != "" {
				ports <- [2]string{api, admin}
				api = ""
			}
		}
		exited <- cmd.Wait()
	}()
	var api, admin string
	select {
	case p := <-ports:
		api, admin = p[0], p[1]
	case err := <-exited:
		exited <- err
		t.Fatalf("/drip serve exited in the empty root before listening: %v\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("/drip serve did not say where it listens:\n%s", stderr.String())
	}

	// It runs as the image's user, in the empty root.
	status, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Uid:\s+` + strconv.Itoa(uid) + `\s`).Match(status) {
		t.Errorf("/drip serve does not run as uid %d:\n%s", uid, status)
	}
	if r, err := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/root"); err != nil || r != root {
		t.Errorf("/drip serve's root is %q (%v), want %s", r, err, root)
	}

	for _, c := range []struct{ method, url, body, want string }{
		{"GET", "http://127.0.0.1:" + admin + "/healthz", "", `"ok"`},
		{"GET", "http://127.0.0.1:" + admin + "/readyz", "", `"ready"`},
		{"POST", "http://127.0.0.1:" + api + "/v1/take", `{"rule": "per-ip", "values": ["192.0.2.1"]}`, `"allowed":true`},
		// A calendar window's time zone loads in the empty root: the
		// binary carries the time zone database.
		{"POST", "http://127.0.0.1:" + api + "/v1/take", `{"key": "cal", "limit": {"algorithm": "fixed_window", "rate": 5, "period": "month", "time_zone": "Europe/Berlin"}}`, `"allowed":true`},
	} {
		req, _ := http.NewRequestWithContext(ctx, c.method, c.url, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", c.method, c.url, err, stderr.String())
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), c.want) {
			t.Errorf("%s %s: %d %s, want 200 and %s", c.method, c.url, resp.StatusCode, b, c.want)
		}
	}

	// docker stop: SIGTERM. drip drains: /readyz answers 503, the
	// decision API still answers, closing the connection; a second
	// SIGTERM ends the drain, and drip exits cleanly.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) { // generous: speed is not tested
		resp, err := http.Get("http://127.0.0.1:" + admin + "/readyz")
		if err != nil {
			t.Fatalf("/readyz after SIGTERM: %v\n%s", err, stderr.String())
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 503 && strings.Contains(string(b), "draining") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz after SIGTERM: still %d %s, want 503 draining", resp.StatusCode, b)
		}
	}
	resp, err := http.Post("http://127.0.0.1:"+api+"/v1/take", "application/json", strings.NewReader(`{"rule": "per-ip", "values": ["192.0.2.1"]}`))
	if err != nil {
		t.Fatalf("take while draining: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("take while draining: %d, Connection: close %v; want 200, closing", resp.StatusCode, resp.Close)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("/drip serve after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("/drip serve did not stop on SIGTERM")
	}
}
