// Package helmtest holds deploy/helm/drip to Kubernetes and to drip
// itself: helm lint and helm template for each values file, every
// rendered object decoded strictly with Kubernetes' API types, and drip
// serve run with the rendered Deployment's arguments, environment and
// files. It is a module of its own so that helm and Kubernetes' modules
// stay out of drip's go.mod; helm is a tool of this module (go tool helm).
package helmtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

var (
	chartDir    = filepath.Join("..", "drip")
	examplesDir = filepath.Join("..", "examples")
	repoRoot    = filepath.Join("..", "..", "..")
)

// The namespace the chart is rendered into.
const namespace = "drip"

// drip serve's shutdown after the drain (server.DefaultShutdownTimeout)
// and its default drain (server.DefaultDrain).
const (
	dripShutdown = 10 * time.Second
	dripDrain    = 5 * time.Second
)

// dripBin is drip, built from this repository by TestMain.
var dripBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "driphelm")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		dripBin = filepath.Join(dir, "drip")
		// The container image's build flags (the Makefile's STATIC_ENV
		// and STATIC_FLAGS): make test's go vet and deploy's container
		// test compile with them, so this build links the packages they
		// compile instead of compiling the whole dependency tree once
		// more with the default flags.
		build := exec.Command("go", "build", "-trimpath", "-o", dripBin, "./cmd/drip")
		build.Dir = repoRoot
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building drip: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

// helm runs this module's helm with args and returns its output.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute) // the first call builds helm
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append([]string{"tool", "helm"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out, nil
}

// decoder decodes YAML or JSON into the API types of the kinds the chart
// renders, strictly: an unknown or duplicated field is an error.
func decoder() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, batchv1.AddToScheme, monitoringv1.AddToScheme, networkingv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// decodeAll decodes every document of a YAML stream.
func decodeAll(stream []byte) ([]runtime.Object, error) {
	dec := decoder()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		var probe map[string]any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			return nil, err
		}
		if probe == nil { // comments only
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%v\n%s", err, doc)
		}
		if gvk.Kind == "" || gvk.Version == "" {
			return nil, fmt.Errorf("a document without apiVersion or kind:\n%s", doc)
		}
		objs = append(objs, obj)
	}
}

// TestStrictDecoding shows that the decoding the chart's tests rely on
// refuses what Kubernetes would refuse or silently drop: unknown fields,
// in a built-in kind and in a ServiceMonitor, and duplicated ones.
func TestStrictDecoding(t *testing.T) {
	good := `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: c, image: i}]
`
	if _, err := decodeAll([]byte(good)); err != nil {
		t.Fatalf("a valid Deployment: %v", err)
	}
	for name, doc := range map[string]string{
		"unknown container field": strings.Replace(good, "image: i}", "image: i, imagePolicy: Always}", 1),
		"misplaced field":         strings.Replace(good, "metadata: {name: d}", "metadata: {name: d, replicas: 2}", 1),
		"duplicated field":        strings.Replace(good, "metadata: {name: d}", "metadata: {name: d, name: e}", 1),
		"unknown ServiceMonitor field": `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: m}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: admin, scrapeEvery: 30s}]
`,
		"unknown kind": "apiVersion: v1\nkind: Secrets\nmetadata: {name: s}\n",
	} {
		if _, err := decodeAll([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
}

// valuesFiles are the values files the chart is tested with: its own
// defaults ("") and every example.
func valuesFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("examples: %v %v", files, err)
	}
	return append([]string{""}, files...)
}

// rendered is the chart rendered with one values file.
type rendered struct {
	values     string
	deployment *appsv1.Deployment
	configMaps map[string]*corev1.ConfigMap
	services   map[string]*corev1.Service
	pdbs       []*policyv1.PodDisruptionBudget
	monitors   []*monitoringv1.ServiceMonitor
	jobs       []*batchv1.Job
	policies   []*networkingv1.NetworkPolicy
}

// render lints the chart with values (a file, or "" for the defaults) and
// renders it, decoding every object strictly. Neither is given
// --kube-version: helm built from its module assumes an old Kubernetes,
// and the chart renders for it too.
func render(t *testing.T, values string, set ...string) *rendered {
	t.Helper()
	var args []string
	if values != "" {
		args = append(args, "-f", values)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	if _, err := helm(t, append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, append([]string{"template", "drip", chartDir, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll(out)
	if err != nil {
		t.Fatalf("%s: %v", values, err)
	}
	r := &rendered{values: values, configMaps: map[string]*corev1.ConfigMap{}, services: map[string]*corev1.Service{}}
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			if r.deployment != nil {
				t.Fatalf("%s: two Deployments", values)
			}
			r.deployment = o
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.Service:
			r.services[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			r.pdbs = append(r.pdbs, o)
		case *monitoringv1.ServiceMonitor:
			r.monitors = append(r.monitors, o)
		case *batchv1.Job:
			r.jobs = append(r.jobs, o)
		case *networkingv1.NetworkPolicy:
			r.policies = append(r.policies, o)
		default:
			// A Secret above all: the chart never holds the store URL.
			t.Errorf("%s: the chart renders a %T, which its tests do not know", values, o)
		}
	}
	if r.deployment == nil {
		t.Fatalf("%s: no Deployment", values)
	}
	return r
}

// container is the Deployment's one container, drip.
func (r *rendered) container(t *testing.T) *corev1.Container {
	t.Helper()
	cs := r.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "drip" {
		t.Fatalf("%s: containers %v: want drip alone", r.values, cs)
	}
	return &cs[0]
}

// flags reads drip's arguments, each --name=value once.
func flags(t *testing.T, args []string) map[string]string {
	t.Helper()
	f := map[string]string{}
	for _, a := range args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, dup := f[name]; !ok || !strings.HasPrefix(a, "--") || dup {
			t.Fatalf("argument %q: want --flag=value, each flag once", a)
		}
		f[name] = value
	}
	return f
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	i := strings.LastIndex(addr, ":")
	n, err := strconv.Atoi(addr[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("address %q: no port", addr)
	}
	return int32(n)
}

// subset reports whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestChart renders the chart with each values file and holds what it
// renders to drip: the listeners on the container ports the image
// exposes, the probes on drip's paths, the rules mounted whole where
// --rules reads them and valid for drip check, the store URL from a
// Secret only, Services, disruption budget and ServiceMonitor selecting
// what they must, the dashboard the same as deploy/grafana/drip.json.
func TestChart(t *testing.T) {
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	expose := strings.Fields(regexp.MustCompile(`(?m)^EXPOSE (.*)$`).FindStringSubmatch(string(dockerfile))[1])
	uid := regexp.MustCompile(`(?m)^USER ([0-9]+)`).FindStringSubmatch(string(dockerfile))
	dashboard, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "drip.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, values := range valuesFiles(t) {
		name := filepath.Base(values)
		if values == "" {
			name = "defaults"
		}
		t.Run(name, func(t *testing.T) {
			r := render(t, values)
			checkRendered(t, r, expose, uid[1], dashboard)
			if values == "" {
				// Production defaults: a NetworkPolicy, and Envoy's
				// listener and Service only when asked for.
				if len(r.policies) != 1 {
					t.Errorf("defaults: %d NetworkPolicies, want one", len(r.policies))
				}
				if _, ok := portNamed(r.container(t), "grpc"); ok || flags(t, r.container(t).Args)["grpc-listen"] != "" {
					t.Errorf("defaults: Envoy's gRPC listener is on: want it only with grpc.enabled")
				}
			}
		})
	}
}

func checkRendered(t *testing.T, r *rendered, expose []string, uid string, dashboard []byte) {
	dep := r.deployment
	pod := dep.Spec.Template
	c := r.container(t)
	podLabels := pod.Labels
	if !subset(dep.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("the Deployment selects %v, the pod has %v", dep.Spec.Selector.MatchLabels, podLabels)
	}

	// Ports: the image exposes each; drip listens on each on every interface.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
		if !slices.Contains(expose, strconv.Itoa(int(p.ContainerPort))) {
			t.Errorf("container port %s %d: not in the Dockerfile's EXPOSE %v", p.Name, p.ContainerPort, expose)
		}
	}
	if ports["http"] == 0 || ports["admin"] == 0 {
		t.Fatalf("container ports %v: want http and admin", ports)
	}
	f := flags(t, c.Args)
	if len(c.Args) > 0 {
		for _, l := range []struct{ flag, port string }{{"listen", "http"}, {"admin-listen", "admin"}, {"grpc-listen", "grpc"}} {
			addr, ok := f[l.flag]
			if !ok && l.port == "grpc" && ports["grpc"] == 0 {
				continue
			}
			if !strings.HasPrefix(addr, "0.0.0.0:") || portOf(t, addr) != ports[l.port] {
				t.Errorf("--%s=%s: want 0.0.0.0 and the container port %q (%d)", l.flag, addr, l.port, ports[l.port])
			}
		}
	} else {
		// No flags: the image's DRIP_LISTEN and DRIP_ADMIN_LISTEN, 8080 and
		// 9090, and the gRPC listener from the environment.
		if ports["http"] != 8080 || ports["admin"] != 9090 {
			t.Errorf("no flags, so drip listens where the image says (8080, 9090), but the container ports are %v", ports)
		}
		if ports["grpc"] != 0 && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == "GRPC_PORT" && e.Value == strconv.Itoa(int(ports["grpc"])) ||
				e.Name == "DRIP_GRPC_LISTEN" && strings.HasSuffix(e.Value, ":"+strconv.Itoa(int(ports["grpc"])))
		}) {
			t.Errorf("no flags and a grpc container port %d, but neither GRPC_PORT nor DRIP_GRPC_LISTEN says drip listens there", ports["grpc"])
		}
	}
	if a := pod.Annotations; a["prometheus.io/scrape"] == "true" && (a["prometheus.io/port"] != strconv.Itoa(int(ports["admin"])) || a["prometheus.io/path"] != "/metrics") {
		t.Errorf("the Prometheus annotations %v do not name the admin port %d and /metrics", a, ports["admin"])
	}

	// Probes: drip's own paths on the admin port; liveness never waits on the store.
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an HTTP GET", what)
			continue
		}
		if p.HTTPGet.Port.String() != "admin" || !slices.Contains([]string{"/healthz", "/readyz", "/healthcheck"}, p.HTTPGet.Path) {
			t.Errorf("%s probe %s on port %s: want /healthz, /readyz or /healthcheck on the admin port", what, p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe on %s: a store down would restart every replica; want /healthz", c.LivenessProbe.HTTPGet.Path)
	}

	// Safety and a stop that fits the grace period.
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || strconv.Itoa(int(*sc.RunAsUser)) != uid {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and the image's USER %s", sc, uid)
	}
	if csc := c.SecurityContext; csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
		csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Errorf("container securityContext: want readOnlyRootFilesystem and no privilege escalation")
	}
	checkSecretModes(t, "the drip container", c.VolumeMounts, pod.Spec.Volumes, sc)
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Errorf("the pod mounts a service account token: drip talks to no Kubernetes API")
	}
	drain := dripDrain
	if v, ok := f["drain"]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			t.Fatalf("--drain=%s: %v", v, err)
		}
		drain = d
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= drain+dripShutdown {
		t.Errorf("terminationGracePeriodSeconds: want more than drip's drain and shutdown, %s", drain+dripShutdown)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}

	// The store: a URL only ever from a Secret, drip's own as a file
	// (envoyproxy/ratelimit's REDIS_URL and REDIS_AUTH, as Envoy Gateway
	// sets them, from a Secret's key).
	checkEnv := func(what string, env []corev1.EnvVar, mounts []corev1.VolumeMount, volumes []corev1.Volume) {
		for _, e := range env {
			switch {
			case e.Name == "DRIP_STORE" && e.Value == "memory":
			case e.Name == "DRIP_STORE_FILE":
				if !secretFile(e.Value, mounts, volumes) {
					t.Errorf("%s: DRIP_STORE_FILE=%s is not in a mounted Secret", what, e.Value)
				}
			case e.Name == "DRIP_STORE" || strings.Contains(e.Value, "://"):
				t.Errorf("%s: %s=%q: the store URL must come from a Secret mounted as a file (DRIP_STORE_FILE)", what, e.Name, e.Value)
			case e.Name == "REDIS_URL" || e.Name == "REDIS_AUTH":
				if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					t.Errorf("%s: %s=%q: a store URL or password must come from a Secret", what, e.Name, e.Value)
				}
			}
		}
	}
	checkEnv("the drip container", c.Env, c.VolumeMounts, pod.Spec.Volumes)
	if st := r.storeType(t); st != "memory" && st != "env" && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "DRIP_STORE_FILE" }) {
		t.Errorf("store %s: no DRIP_STORE_FILE", st)
	}

	// The rules: a ConfigMap mounted whole (a subPath never updates) where --rules reads.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("volume %s mounted with a subPath: the kubelet never updates it", m.Name)
		}
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("volume mount %s: no such volume", m.Name)
		}
	}
	if rules, ok := f["rules"]; ok {
		cm := r.mountedConfigMap(t, rules)
		dir := t.TempDir()
		for name, body := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := exec.Command(dripBin, "check", dir).CombinedOutput(); err != nil {
			t.Errorf("drip check of the rules ConfigMap %s: %v\n%s", cm.Name, err, out)
		}
	}

	// Services, the disruption budget and the ServiceMonitor select the pods.
	for name, s := range r.services {
		if !subset(s.Spec.Selector, podLabels) {
			t.Errorf("Service %s selects %v, the pod has %v", name, s.Spec.Selector, podLabels)
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.String() == "" || ports[p.TargetPort.String()] == 0 {
				t.Errorf("Service %s port %s: targetPort %s is not a named container port", name, p.Name, p.TargetPort.String())
			}
			if p.Name == "grpc" && (p.AppProtocol == nil || *p.AppProtocol != "grpc") {
				t.Errorf("Service %s: the gRPC port must say appProtocol grpc (HTTP/2 for meshes)", name)
			}
		}
	}
	if _, ok := r.services["drip"]; !ok {
		t.Errorf("no Service drip (the decision API or gateway) among %v", r.services)
	}
	if rl, ok := r.services["drip-ratelimit"]; ok != (ports["grpc"] != 0) || ok && (len(rl.Spec.Ports) != 1 || rl.Spec.Ports[0].TargetPort.String() != "grpc") {
		t.Errorf("Service drip-ratelimit (%v) and the grpc container port (%d): want both or neither, one port to grpc", ok, ports["grpc"])
	}
	replicas := int32(1)
	if dep.Spec.Replicas != nil {
		replicas = *dep.Spec.Replicas
	}
	for _, p := range r.pdbs {
		if !subset(p.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("PodDisruptionBudget %s selects %v, the pod has %v", p.Name, p.Spec.Selector.MatchLabels, podLabels)
		}
		if mu := p.Spec.MaxUnavailable; mu == nil || mu.IntValue() < 1 || replicas > 1 && int32(mu.IntValue()) >= replicas {
			t.Errorf("PodDisruptionBudget %s: maxUnavailable %v with %d replicas: want a drain to leave a replica serving", p.Name, mu, replicas)
		}
	}
	for _, m := range r.monitors {
		var selected []string
		for name, s := range r.services {
			if subset(m.Spec.Selector.MatchLabels, s.Labels) {
				selected = append(selected, name)
			}
		}
		if len(selected) != 1 || len(m.Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor %s selects Services %v with %d endpoints: want the admin Service alone, once", m.Name, selected, len(m.Spec.Endpoints))
		}
		s, e := r.services[selected[0]], m.Spec.Endpoints[0]
		if e.Path != "/metrics" || !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port && p.TargetPort.String() == "admin" }) {
			t.Errorf("ServiceMonitor %s scrapes %s on port %q of Service %s: want /metrics on the port to admin", m.Name, e.Path, e.Port, s.Name)
		}
		if !slices.Equal(m.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
			t.Errorf("ServiceMonitor %s looks in namespaces %v, want the release's", m.Name, m.Spec.NamespaceSelector.MatchNames)
		}
	}

	// The NetworkPolicy: the pods' ingress, each port from its peers; the
	// admin port (/metrics, /json, the admin API) never from anyone.
	for _, np := range r.policies {
		if !subset(np.Spec.PodSelector.MatchLabels, podLabels) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("NetworkPolicy %s selects %v for %v: want the pods, ingress only", np.Name, np.Spec.PodSelector.MatchLabels, np.Spec.PolicyTypes)
		}
		open := map[string]bool{}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				name := p.Port.String()
				if ports[name] == 0 {
					t.Errorf("NetworkPolicy %s: port %s is not a named container port", np.Name, name)
				}
				open[name] = true
				if name == "admin" && len(rule.From) == 0 {
					t.Errorf("NetworkPolicy %s: the admin port is open to anyone", np.Name)
				}
			}
		}
		for name := range ports {
			if !open[name] {
				t.Errorf("NetworkPolicy %s: port %s admits no one", np.Name, name)
			}
		}
	}

	// The dashboard: deploy/grafana/drip.json, byte for byte, for the sidecar.
	if cm, ok := r.configMaps["drip-dashboard"]; ok {
		if cm.Labels["grafana_dashboard"] == "" {
			t.Errorf("ConfigMap %s: no grafana_dashboard label for Grafana's sidecar (labels %v)", cm.Name, cm.Labels)
		}
		if cm.Data["drip.json"] != string(dashboard) {
			t.Errorf("ConfigMap %s: drip.json differs from deploy/grafana/drip.json (copy it to deploy/helm/drip/dashboards/)", cm.Name)
		}
	}

	// drip pg install before the rollout, on the same Secret.
	for _, j := range r.jobs {
		spec := j.Spec.Template.Spec
		if len(spec.Containers) != 1 || !slices.Equal(spec.Containers[0].Command, []string{"/drip"}) || !slices.Equal(spec.Containers[0].Args[:2], []string{"pg", "install"}) {
			t.Fatalf("Job %s: want /drip pg install, got %+v", j.Name, spec.Containers)
		}
		jc := spec.Containers[0]
		checkEnv("Job "+j.Name, jc.Env, jc.VolumeMounts, spec.Volumes)
		checkSecretModes(t, "Job "+j.Name, jc.VolumeMounts, spec.Volumes, spec.SecurityContext)
		if !slices.ContainsFunc(jc.Env, func(e corev1.EnvVar) bool { return e.Name == "DRIP_STORE_FILE" }) {
			t.Errorf("Job %s: no DRIP_STORE_FILE from the Secret", j.Name)
		}
		if !strings.Contains(j.Annotations["helm.sh/hook"], "pre-upgrade") || spec.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("Job %s: want a pre-install, pre-upgrade hook that does not restart in place", j.Name)
		}
		// The flags exist: drip pg install refuses unknown ones (exit 2).
		cmd := exec.Command(dripBin, append(slices.Clone(jc.Args), "--url", "memory")...)
		if out, _ := cmd.CombinedOutput(); !strings.Contains(string(out), "is not a PostgreSQL URL") {
			t.Errorf("drip %s: %s", strings.Join(jc.Args, " "), out)
		}
	}
}

// secretFile reports whether path is a file of a Secret volume mounted
// among mounts.
func secretFile(path string, mounts []corev1.VolumeMount, volumes []corev1.Volume) bool {
	for _, m := range mounts {
		dir, name := filepath.Split(path)
		if filepath.Clean(dir) != m.MountPath {
			continue
		}
		for _, v := range volumes {
			if v.Name == m.Name && v.Secret != nil {
				return slices.ContainsFunc(v.Secret.Items, func(it corev1.KeyToPath) bool { return it.Path == name })
			}
		}
	}
	return false
}

// checkSecretModes: every Secret file mounted in a container is readable
// by the pod's user (sc's). The kubelet writes them as root, in the group
// fsGroup when the pod has one, with their mode as given: 0400 alone,
// with a user that is not root, cannot be read.
func checkSecretModes(t *testing.T, what string, mounts []corev1.VolumeMount, volumes []corev1.Volume, sc *corev1.PodSecurityContext) {
	t.Helper()
	for _, m := range mounts {
		for _, v := range volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, it := range append([]corev1.KeyToPath{{Path: "(default)", Mode: v.Secret.DefaultMode}}, v.Secret.Items...) {
				if !readable(it.Mode, v.Secret.DefaultMode, sc) {
					t.Errorf("%s: Secret volume %s, file %s: mode %o, which the pod's user cannot read (no fsGroup, or no group read)", what, v.Name, it.Path, modeOf(it.Mode, v.Secret.DefaultMode))
				}
			}
		}
	}
}

// modeOf is a Secret file's mode: its own, else the volume's default,
// else Kubernetes' 0644.
func modeOf(mode, def *int32) int32 {
	switch {
	case mode != nil:
		return *mode
	case def != nil:
		return *def
	}
	return 0o644
}

// readable says whether a Secret file of that mode, owned by root and in
// the group fsGroup when sc has one, can be read by sc's user.
func readable(mode, def *int32, sc *corev1.PodSecurityContext) bool {
	m := modeOf(mode, def)
	switch {
	case m&0o004 != 0:
		return true
	case sc != nil && sc.FSGroup != nil && m&0o040 != 0:
		return true
	}
	return sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0
}

// storeType is the store.type the chart was rendered with.
func (r *rendered) storeType(t *testing.T) string {
	t.Helper()
	values := map[string]any{}
	if r.values != "" {
		b, err := os.ReadFile(r.values)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &values); err != nil {
			t.Fatal(err)
		}
	}
	if st, ok := values["store"].(map[string]any); ok {
		if typ, ok := st["type"].(string); ok {
			return typ
		}
	}
	return "memory" // the chart's default
}

// mountedConfigMap is the rendered ConfigMap the container mounts at path.
func (r *rendered) mountedConfigMap(t *testing.T, path string) *corev1.ConfigMap {
	t.Helper()
	c := r.container(t)
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range r.deployment.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				if cm, ok := r.configMaps[v.ConfigMap.Name]; ok {
					return cm
				}
				t.Fatalf("volume %s: ConfigMap %s is not rendered", v.Name, v.ConfigMap.Name)
			}
		}
	}
	t.Fatalf("nothing mounted at %s", path)
	return nil
}

// TestChartRefuses: values that would deploy a drip that limits wrongly,
// or a store URL in plain values, fail at helm install, with the reason.
func TestChartRefuses(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"replicaCount=2"}, "keeps buckets in each replica's own memory"},
		{[]string{"store.type=redis"}, "set store.existingSecret"},
		{[]string{"store.type=postgres", "store.url=postgres://u:secret@db/drip"}, "additional properties 'url' not allowed"},
		{[]string{"store.type=mongo"}, "store.type"},
		{[]string{"replicaCount=2", "store.type=redis", "store.existingSecret=s", "podDisruptionBudget.maxUnavailable=2"}, "a drain could take every replica"},
		{[]string{"probes.liveness.path=/"}, "probes.liveness.path"},
		{[]string{"extraArgs[0]=-store=redis://x"}, "extraArgs"},
		{[]string{"networkPolicy.adminFrom[0].podSelectr.app=x"}, "networkPolicy.adminFrom"},
	} {
		args := []string{"template", "drip", chartDir}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		_, err := helm(t, args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %v: %v, want an error saying %q", c.set, err, c.want)
		}
	}
}
