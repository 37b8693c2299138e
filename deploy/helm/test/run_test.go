package helmtest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestDeploymentRuns renders the chart and runs drip serve as the
// Deployment's container would run: its arguments, its environment (a
// Secret's key, the memory limit), its mounted ConfigMaps and Secrets as
// directories, with the listen addresses moved to free loopback ports
// and the upstream to a stand-in. The probes must answer 200, a decision
// or a request through the gateway must pass, and SIGTERM must turn the
// readiness probe to 503 and stop drip cleanly within the grace period.
// The Redis values run against a real redis-server, and against none:
// the Redis example's pods start and are ready while Redis is down.
func TestDeploymentRuns(t *testing.T) {
	// Each waits most of its time on drip's drain: run them together.
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		runDeployment(t, render(t, ""), nil)
	})
	t.Run("memory.yaml", func(t *testing.T) {
		t.Parallel()
		runDeployment(t, render(t, filepath.Join(examplesDir, "memory.yaml")), nil)
	})
	t.Run("redis.yaml", func(t *testing.T) {
		t.Parallel()
		addr := startRedis(t)
		runDeployment(t, render(t, filepath.Join(examplesDir, "redis.yaml")), map[string]string{
			"drip-store/url": "redis://" + addr,
		})
	})
	t.Run("redis.yaml, Redis down", func(t *testing.T) {
		// A store incident during a rollout: the pods start, decide
		// locally (the example's on_error: local) and are ready.
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens there
		runDeployment(t, render(t, filepath.Join(examplesDir, "redis.yaml")), map[string]string{
			"drip-store/url": "redis://" + addr,
		})
	})
	t.Run("sentinel.yaml", func(t *testing.T) {
		t.Parallel()
		sentinel := startSentinel(t, startRedis(t))
		runDeployment(t, render(t, filepath.Join(examplesDir, "sentinel.yaml")), map[string]string{
			"drip-store/url": "redis+sentinel://" + sentinel + "/mymaster",
		})
	})
}

// runDeployment runs r's container; secrets holds each Secret key the pod
// reads, as "name/key".
func runDeployment(t *testing.T, r *rendered, secrets map[string]string) {
	c := r.container(t)
	pod := r.deployment.Spec.Template.Spec

	// Volumes: ConfigMaps and Secrets as directories.
	mounts := map[string]string{} // mount path -> local directory
	for _, m := range c.VolumeMounts {
		dir := t.TempDir()
		mounts[m.MountPath] = dir
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			files := map[string]string{}
			switch {
			case v.ConfigMap != nil:
				cm, ok := r.configMaps[v.ConfigMap.Name]
				if !ok {
					t.Fatalf("volume %s: ConfigMap %s is not rendered", v.Name, v.ConfigMap.Name)
				}
				files = cm.Data
			case v.Secret != nil:
				for _, it := range v.Secret.Items {
					files[it.Path] = secret(t, secrets, v.Secret.SecretName, it.Key)
				}
			default:
				t.Fatalf("volume %s: neither a ConfigMap nor a Secret", v.Name)
			}
			for name, body := range files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	local := func(path string) string {
		for m, dir := range mounts {
			if path == m || strings.HasPrefix(path, m+"/") {
				return dir + strings.TrimPrefix(path, m)
			}
		}
		return path
	}

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream") }))
	t.Cleanup(upstream.Close)
	loopback := map[string]string{"listen": "127.0.0.1:0", "admin-listen": "127.0.0.1:0", "grpc-listen": "127.0.0.1:0", "upstream": upstream.URL}
	args := []string{"serve"} // the image's ENTRYPOINT: /drip serve
	for _, a := range c.Args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if v, ok := loopback[name]; ok {
			value = v
		}
		args = append(args, "--"+name+"="+local(value))
	}
	// The image's environment, moved to loopback, then the container's.
	env := []string{"DRIP_LISTEN=127.0.0.1:0", "DRIP_ADMIN_LISTEN=127.0.0.1:0"}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+local(e.Value))
		case e.ValueFrom.SecretKeyRef != nil:
			env = append(env, e.Name+"="+secret(t, secrets, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key))
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			env = append(env, fmt.Sprintf("%s=%d", e.Name, c.Resources.Limits.Memory().Value()))
		default:
			t.Fatalf("env %s: a source the test does not know", e.Name)
		}
	}

	cmd := exec.Command(dripBin, args...)
	cmd.Env = env
	stdout, stdoutW := io.Pipe()
	cmd.Stdout = stdoutW
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once drip has stopped, waitErr then says how.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); stdoutW.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	// drip says where it listens, one line each; the rest is read and dropped.
	quit := make(chan struct{})
	t.Cleanup(func() { close(quit) }) // runs first: the reader stops blocking
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-quit:
				io.Copy(io.Discard, stdout)
				return
			}
		}
	}()
	addrs := map[string]string{}
	want := []string{"http", "admin"}
	if _, ok := portNamed(c, "grpc"); ok {
		want = append(want, "grpc")
	}
	patterns := map[string]*regexp.Regexp{
		"http":  regexp.MustCompile(`(?:decision API|gateway) on http://(\S+)`),
		"admin": regexp.MustCompile(`metrics on http://(\S+)/metrics`),
		"grpc":  regexp.MustCompile(`Envoy rate limit service .* on (\S+)$`),
	}
	deadline := time.After(60 * time.Second)
	for len(addrs) < len(want) {
		select {
		case l, ok := <-lines:
			if !ok {
				<-exited
				t.Fatalf("drip %s stopped before it listened on %v: %v\n%s", strings.Join(args, " "), want, waitErr, stderr.String())
			}
			for name, re := range patterns {
				if m := re.FindStringSubmatch(l); m != nil {
					addrs[name] = m[1]
				}
			}
		case <-deadline:
			t.Fatalf("drip did not say where it listens within 60 s: %v\n%s", addrs, stderr.String())
		}
	}
	go func() { // what else drip says
		for range lines {
		}
	}()

	get := func(addr, path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if code, body := get(addrs[p.HTTPGet.Port.String()], p.HTTPGet.Path); code != 200 {
			t.Errorf("probe GET %s on port %s: %d %s", p.HTTPGet.Path, p.HTTPGet.Port.String(), code, body)
		}
	}
	if code, body := get(addrs["admin"], "/healthcheck"); code != 200 || strings.TrimSpace(body) != "OK" {
		t.Errorf("GET /healthcheck: %d %q", code, body)
	}
	if code, body := get(addrs["admin"], "/metrics"); code != 200 || !strings.Contains(body, "drip_") {
		t.Errorf("GET /metrics: %d, no drip_ metrics", code)
	}
	if flags(t, c.Args)["upstream"] != "" {
		if code, body := get(addrs["http"], "/"); code != 200 || body != "upstream" {
			t.Errorf("through the gateway: %d %q", code, body)
		}
	} else {
		resp, err := http.Post("http://"+addrs["http"]+"/v1/take", "application/json",
			strings.NewReader(`{"key": "user:1", "limit": {"rate": 5, "period": "10s", "burst": 20}}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"allowed":true`) {
			t.Errorf("POST /v1/take: %d %s", resp.StatusCode, body)
		}
	}
	if a, ok := addrs["grpc"]; ok {
		conn, err := net.DialTimeout("tcp", a, 10*time.Second)
		if err != nil {
			t.Errorf("Envoy's rate limit service on %s: %v", a, err)
		} else {
			conn.Close()
		}
	}

	// SIGTERM: readiness turns 503 (the endpoints drop the pod), then
	// drip stops by itself, within the grace period.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	grace := time.Duration(*r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	timeout := time.After(grace)
	ready := c.ReadinessProbe.HTTPGet
	sawUnready := false
	for {
		select {
		case <-exited:
			if waitErr != nil {
				t.Errorf("drip after SIGTERM: %v\n%s", waitErr, stderr.String())
			}
			if !sawUnready {
				t.Errorf("drip stopped without its readiness probe answering 503 first")
			}
			return
		case <-timeout:
			t.Fatalf("drip still running %s after SIGTERM, the pod's grace period", grace)
		case <-time.After(50 * time.Millisecond):
			if sawUnready {
				continue
			}
			resp, err := http.Get("http://" + addrs["admin"] + ready.Path)
			if err == nil {
				resp.Body.Close()
				sawUnready = resp.StatusCode == 503
			}
		}
	}
}

// portNamed is the container port named name.
func portNamed(c *corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// secret is the test's value of a Secret's key.
func secret(t *testing.T, secrets map[string]string, name, key string) string {
	t.Helper()
	v, ok := secrets[name+"/"+key]
	if !ok {
		t.Fatalf("the pod reads key %s of Secret %s, which the test does not hold", key, name)
	}
	return v
}

// startRedis starts a throwaway redis-server on a free loopback port and
// returns its address. Under CI=true a missing redis-server fails.
func startRedis(t *testing.T) string {
	return startRedisServer(t)
}

// startSentinel starts a Redis Sentinel that names the server at master
// mymaster, and returns its address once it does.
func startSentinel(t *testing.T, master string) string {
	host, port, _ := net.SplitHostPort(master)
	conf := filepath.Join(t.TempDir(), "sentinel.conf") // a Sentinel rewrites its file
	body := fmt.Sprintf("sentinel monitor mymaster %s %s 1\n", host, port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return startRedisServer(t, conf, "--sentinel")
}

// startRedisServer runs redis-server with args before its own and waits
// for it to answer PING.
func startRedisServer(t *testing.T, args ...string) string {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found (CI must have it)")
		}
		t.Skip("redis-server not found")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	args = append(args, "--port", port, "--bind", "127.0.0.1", "--dir", t.TempDir())
	if !slices.Contains(args, "--sentinel") {
		args = append(args, "--save", "", "--appendonly", "no")
	}
	cmd := exec.Command(bin, args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(conn, "PING\r\n")
			reply, _ := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if reply == "+PONG\r\n" {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer within 60 s: %v\n%s", addr, err, out.String())
		}
	}
}

// syncBuffer is a buffer that a process writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
