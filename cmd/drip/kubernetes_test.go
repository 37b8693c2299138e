package main

import (
	"errors"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/driplimit/drip/server"
)

// The parts of Kubernetes objects that the test reads.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Resources []string          `yaml:"resources"` // Kustomization
	Data      map[string]string `yaml:"data"`      // ConfigMap
	Spec      struct {
		Replicas int              `yaml:"replicas"`
		Selector k8sSelector      `yaml:"selector"` // Deployment, PodDisruptionBudget; a Service's is a plain map
		Template k8sPodTemplate   `yaml:"template"`
		Ports    []k8sServicePort `yaml:"ports"`
		// PodDisruptionBudget
		MaxUnavailable *int `yaml:"maxUnavailable"`
		MinAvailable   *int `yaml:"minAvailable"`
	} `yaml:"spec"`
}

// k8sSelector is a label selector, or a Service's plain label map.
type k8sSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

func (s *k8sSelector) UnmarshalYAML(n *yaml.Node) error {
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		return err
	}
	if _, ok := m["matchLabels"]; ok {
		type plain k8sSelector
		return n.Decode((*plain)(s))
	}
	return n.Decode(&s.MatchLabels)
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

type k8sServicePort struct {
	Name        string `yaml:"name"`
	Port        int    `yaml:"port"`
	TargetPort  any    `yaml:"targetPort"`
	AppProtocol string `yaml:"appProtocol"`
}

type k8sPodTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               struct {
			RunAsNonRoot bool `yaml:"runAsNonRoot"`
			RunAsUser    int  `yaml:"runAsUser"`
			RunAsGroup   int  `yaml:"runAsGroup"`
			FSGroup      *int `yaml:"fsGroup"`
		} `yaml:"securityContext"`
		Containers []k8sContainer `yaml:"containers"`
		Volumes    []struct {
			Name      string `yaml:"name"`
			ConfigMap struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
			Secret struct {
				SecretName  string `yaml:"secretName"`
				DefaultMode *int   `yaml:"defaultMode"`
				Items       []struct {
					Path string `yaml:"path"`
					Mode *int   `yaml:"mode"`
				} `yaml:"items"`
			} `yaml:"secret"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name string   `yaml:"name"`
	Args []string `yaml:"args"`
	Env  []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe k8sProbe `yaml:"readinessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

// TestKubernetesManifests decodes every manifest of deploy/kubernetes and
// checks them against drip serve itself: the listen ports against the
// container ports, the Dockerfile's EXPOSE and drip's default ports; the
// probes against the admin listener's paths; the rules mount against
// --rules; the selectors against the pod's labels. Then it runs drip
// serve with the Deployment's own arguments (addresses moved to free
// loopback ports, the rules from the ConfigMap, a stand-in upstream): a
// renamed flag or a bad rule in the ConfigMap fails here, and the probe
// paths must answer 200.
func TestKubernetesManifests(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "kubernetes")
	objs := map[string]*k8sObject{} // kind/name
	var files []string
	var kustomize *k8sObject
	paths, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for {
			o := new(k8sObject)
			err := dec.Decode(o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if o.Kind == "Kustomization" {
				kustomize = o
				continue
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: an object without apiVersion, kind or metadata.name", p)
			}
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
		f.Close()
		if filepath.Base(p) != "kustomization.yaml" {
			files = append(files, filepath.Base(p))
		}
	}
	if kustomize == nil || !slices.Equal(slices.Sorted(slices.Values(kustomize.Resources)), files) {
		t.Fatalf("kustomization.yaml lists %v, want every manifest: %v", kustomize, files)
	}
	need := func(key string) *k8sObject {
		t.Helper()
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s among %v", key, slices.Sorted(maps.Keys(objs)))
		}
		return o
	}
	dep := need("Deployment/drip")
	pod := dep.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("the pod has %d containers, want drip alone", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	podLabels := pod.Metadata.Labels
	selects := func(what string, sel map[string]string) {
		t.Helper()
		if len(sel) == 0 {
			t.Errorf("%s: no selector", what)
		}
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("%s selects %s=%s, which the pod does not have (%v)", what, k, v, podLabels)
			}
		}
	}
	selects("the Deployment", dep.Spec.Selector.MatchLabels)

	// Flags: --name=value, each once.
	flags := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") || flags[name] != "" {
			t.Fatalf("argument %q: want --flag=value, each flag once", a)
		}
		flags[name] = value
	}

	// Ports: each listener on every interface, on its container port,
	// which the image exposes; the HTTP ones are drip's default ports.
	dockerfile, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	expose := strings.Fields(regexp.MustCompile(`(?m)^EXPOSE (.*)$`).FindStringSubmatch(string(dockerfile))[1])
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
		if !slices.Contains(expose, strconv.Itoa(p.ContainerPort)) {
			t.Errorf("container port %s %d: not in the Dockerfile's EXPOSE %v", p.Name, p.ContainerPort, expose)
		}
	}
	portOf := func(addr string) int {
		t.Helper()
		_, p, err := net.SplitHostPort(addr)
		n, err2 := strconv.Atoi(p)
		if err != nil || err2 != nil {
			t.Fatalf("address %q: %v %v", addr, err, err2)
		}
		return n
	}
	for _, l := range []struct{ flag, port, def string }{
		{"listen", "http", server.DefaultListen},
		{"admin-listen", "admin", server.DefaultAdminListen},
		{"grpc-listen", "grpc", ""},
	} {
		addr := flags[l.flag]
		host, _, _ := net.SplitHostPort(addr)
		if host != "0.0.0.0" || portOf(addr) != ports[l.port] {
			t.Errorf("--%s=%s: want 0.0.0.0 and the container port %q (%d)", l.flag, addr, l.port, ports[l.port])
		}
		if l.def != "" && portOf(addr) != portOf(l.def) {
			t.Errorf("--%s=%s: not drip's default port (%s)", l.flag, addr, l.def)
		}
	}
	if a := pod.Metadata.Annotations["prometheus.io/port"]; a != strconv.Itoa(ports["admin"]) || pod.Metadata.Annotations["prometheus.io/path"] != "/metrics" {
		t.Errorf("the Prometheus annotations (%v) do not name the admin port %d and /metrics", pod.Metadata.Annotations, ports["admin"])
	}

	// Probes on the admin listener.
	for _, p := range []struct {
		what, path string
		port       any
	}{
		{"liveness", c.LivenessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Port},
		{"readiness", c.ReadinessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Port},
	} {
		want := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[p.what]
		if p.path != want || (p.port != "admin" && p.port != ports["admin"]) {
			t.Errorf("%s probe: %v on port %v, want %s on the admin port", p.what, p.path, p.port, want)
		}
	}

	// The rules: the ConfigMap mounted whole (a subPath never updates) at --rules.
	var rulesCM string
	for _, m := range c.VolumeMounts {
		if m.MountPath != flags["rules"] {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("the rules are mounted with subPath %s: the kubelet never updates it", m.SubPath)
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name {
				rulesCM = v.ConfigMap.Name
			}
		}
	}
	cm := need("ConfigMap/" + rulesCM)

	// Safety: non-root (the image's user), read-only root, a graceful stop
	// that fits the grace period, resources, the store URL from a Secret.
	uid := regexp.MustCompile(`(?m)^USER ([0-9]+)`).FindStringSubmatch(string(dockerfile))
	sc := pod.Spec.SecurityContext
	if !sc.RunAsNonRoot || uid == nil || strconv.Itoa(sc.RunAsUser) != uid[1] {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and the image's USER %v", sc, uid)
	}
	if csc := c.SecurityContext; !csc.ReadOnlyRootFilesystem || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext: want readOnlyRootFilesystem and no privilege escalation")
	}
	drain := server.DefaultDrain
	if v, ok := flags["drain"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("--drain=%s: %v", v, err)
		}
		drain = d
	}
	if stop := c.Lifecycle.PreStop.Sleep.Seconds + int(math.Ceil((drain + server.DefaultShutdownTimeout).Seconds())); pod.Spec.TerminationGracePeriodSeconds <= stop {
		t.Errorf("terminationGracePeriodSeconds %d: a preStop pause, drip's drain and its shutdown take %d s", pod.Spec.TerminationGracePeriodSeconds, stop)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	// The store URL may hold a password: from a Secret mounted as the
	// file DRIP_STORE_FILE names, never in an environment variable (one
	// shows in kubectl describe, in /proc and in crash reports).
	storeFile := ""
	for _, e := range c.Env {
		switch {
		case e.Name == "DRIP_STORE_FILE":
			storeFile = e.Value
		case e.Name == "DRIP_STORE" || e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "drip-store":
			t.Errorf("env %s: the store URL must come from the Secret drip-store mounted as a file (DRIP_STORE_FILE), not the environment", e.Name)
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && v.Secret.SecretName == "drip-store" && storeFile != "" && filepath.Dir(storeFile) == m.MountPath && m.SubPath == "" {
				mounted = true
			}
			// The kubelet writes a Secret's files as root, in the group
			// fsGroup when the pod has one: drip's user must read them.
			if v.Name != m.Name || v.Secret.SecretName == "" {
				continue
			}
			for _, it := range v.Secret.Items {
				mode := 0o644
				switch {
				case it.Mode != nil:
					mode = *it.Mode
				case v.Secret.DefaultMode != nil:
					mode = *v.Secret.DefaultMode
				}
				if mode&0o004 == 0 && (sc.FSGroup == nil || mode&0o040 == 0) {
					t.Errorf("Secret %s, file %s: mode %o, which the pod's user %d cannot read (no fsGroup, or no group read)", v.Secret.SecretName, it.Path, mode, sc.RunAsUser)
				}
			}
		}
	}
	if !mounted {
		t.Errorf("DRIP_STORE_FILE=%q is not a file of the Secret drip-store mounted in the container", storeFile)
	}

	// Services and the disruption budget select the pod; the rate limit
	// service speaks gRPC on the grpc port.
	for key, o := range objs {
		switch o.Kind {
		case "Service":
			selects(key, o.Spec.Selector.MatchLabels)
			for _, p := range o.Spec.Ports {
				if name, ok := p.TargetPort.(string); !ok || ports[name] == 0 {
					t.Errorf("%s port %s: targetPort %v is not a named container port", key, p.Name, p.TargetPort)
				}
			}
		case "PodDisruptionBudget":
			selects(key, o.Spec.Selector.MatchLabels)
			if o.Spec.MaxUnavailable == nil || *o.Spec.MaxUnavailable < 1 || *o.Spec.MaxUnavailable >= dep.Spec.Replicas {
				t.Errorf("%s: maxUnavailable %v with %d replicas: want at least one pod serving during a drain", key, o.Spec.MaxUnavailable, dep.Spec.Replicas)
			}
		}
	}
	rls := need("Service/drip-ratelimit")
	if len(rls.Spec.Ports) != 1 || rls.Spec.Ports[0].TargetPort != "grpc" || rls.Spec.Ports[0].Name != "grpc" || rls.Spec.Ports[0].AppProtocol != "grpc" {
		t.Errorf("Service/drip-ratelimit ports %+v: want one port named grpc, appProtocol grpc, to the grpc container port", rls.Spec.Ports)
	}
	need("PodDisruptionBudget/drip")

	// drip serve with these very arguments.
	rulesDir := t.TempDir()
	for name, body := range cm.Data {
		writeTestFile(t, filepath.Join(rulesDir, name), body)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream") }))
	t.Cleanup(upstream.Close)
	local := map[string]string{"listen": "127.0.0.1:0", "admin-listen": "127.0.0.1:0", "grpc-listen": "127.0.0.1:0",
		"rules": rulesDir, "upstream": upstream.URL}
	var args []string
	for _, a := range c.Args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if v, ok := local[name]; ok {
			a = "--" + name + "=" + v
		}
		args = append(args, a)
	}
	gw, admin, _ := serveInProcess(t, args...)
	for _, path := range []string{c.LivenessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Path} {
		if code, out := httpDo(t, "GET", "http://"+admin+path, ""); code != 200 {
			t.Errorf("GET %s on the admin listener: %d %s", path, code, out)
		}
	}
	if code, out := httpDo(t, "GET", "http://"+gw+"/", ""); code != 200 || out != "upstream" {
		t.Errorf("through the gateway: %d %q", code, out)
	}
}
