// Copyright The otelcol-llm Authors
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// manifests are the objects of deploy/kubernetes/<shape>, decoded into
// Kubernetes' own types with unknown fields refused.
type manifests struct {
	serviceAccounts     []corev1.ServiceAccount
	clusterRoles        []rbacv1.ClusterRole
	clusterRoleBindings []rbacv1.ClusterRoleBinding
	roles               []rbacv1.Role
	roleBindings        []rbacv1.RoleBinding
	configMaps          []corev1.ConfigMap
	daemonSets          []appsv1.DaemonSet
	deployments         []appsv1.Deployment
	services            []corev1.Service
}

func decodeStrict[T any](t *testing.T, where string, doc []byte) T {
	t.Helper()
	var v T
	require.NoError(t, yaml.UnmarshalStrict(doc, &v), "%s", where)
	return v
}

func loadManifests(t *testing.T, shape string) manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("kubernetes", shape, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var m manifests
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(data), -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			where := f + " document " + strconv.Itoa(i+1)
			var tm metav1.TypeMeta
			require.NoError(t, yaml.Unmarshal([]byte(doc), &tm), where)
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 ServiceAccount":
				m.serviceAccounts = append(m.serviceAccounts, decodeStrict[corev1.ServiceAccount](t, where, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				m.clusterRoles = append(m.clusterRoles, decodeStrict[rbacv1.ClusterRole](t, where, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				m.clusterRoleBindings = append(m.clusterRoleBindings, decodeStrict[rbacv1.ClusterRoleBinding](t, where, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 Role":
				m.roles = append(m.roles, decodeStrict[rbacv1.Role](t, where, []byte(doc)))
			case "rbac.authorization.k8s.io/v1 RoleBinding":
				m.roleBindings = append(m.roleBindings, decodeStrict[rbacv1.RoleBinding](t, where, []byte(doc)))
			case "v1 ConfigMap":
				m.configMaps = append(m.configMaps, decodeStrict[corev1.ConfigMap](t, where, []byte(doc)))
			case "apps/v1 DaemonSet":
				m.daemonSets = append(m.daemonSets, decodeStrict[appsv1.DaemonSet](t, where, []byte(doc)))
			case "apps/v1 Deployment":
				m.deployments = append(m.deployments, decodeStrict[appsv1.Deployment](t, where, []byte(doc)))
			case "v1 Service":
				m.services = append(m.services, decodeStrict[corev1.Service](t, where, []byte(doc)))
			default:
				t.Fatalf("%s: a %s %s the test does not know", where, tm.APIVersion, tm.Kind)
			}
		}
	}
	return m
}

// collectorConfig is what the wiring checks read of a collector config.
type collectorConfig struct {
	text string
	// env are the ${env:NAME} the config reads without a default.
	env []string
	// ports are the TCP ports it listens on, by what listens.
	ports map[string]int32
	// udpPorts are its UDP ports.
	udpPorts map[string]int32
	health   int32
	// unixSocket is the hooks' Unix socket, if any; unixSocketMode and
	// unixSocketGroup its socket_mode and socket_group.
	unixSocket, unixSocketMode, unixSocketGroup string
}

func readCollectorConfig(t *testing.T, path string) collectorConfig {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	c := collectorConfig{text: string(data), ports: map[string]int32{}, udpPorts: map[string]int32{}}
	for _, m := range regexp.MustCompile(`\$\{env:([A-Z0-9_]+)\}`).FindAllStringSubmatch(c.text, -1) {
		if !slices.Contains(c.env, m[1]) {
			c.env = append(c.env, m[1])
		}
	}
	var cfg struct {
		Extensions map[string]struct {
			Endpoint string `json:"endpoint"`
		} `json:"extensions"`
		Receivers struct {
			TokenStream struct {
				Hooks struct {
					HTTP struct{ Endpoint string } `json:"http"`
					UDP  struct{ Endpoint string } `json:"udp"`
					Unix struct {
						Endpoint    string
						SocketMode  string `json:"socket_mode"`
						SocketGroup string `json:"socket_group"`
					} `json:"unix"`
				} `json:"hooks"`
				Proxy struct{ Endpoint string } `json:"proxy"`
			} `json:"token_stream"`
			OTLP struct {
				Protocols struct {
					GRPC struct{ Endpoint string } `json:"grpc"`
					HTTP struct{ Endpoint string } `json:"http"`
				} `json:"protocols"`
			} `json:"otlp"`
		} `json:"receivers"`
		Exporters struct {
			Prometheus struct{ Endpoint string } `json:"prometheus"`
		} `json:"exporters"`
		Service struct {
			Telemetry struct {
				Metrics struct {
					Readers []struct {
						Pull struct {
							Exporter struct {
								Prometheus struct {
									Port int32 `json:"port"`
								} `json:"prometheus"`
							} `json:"exporter"`
						} `json:"pull"`
					} `json:"readers"`
				} `json:"metrics"`
			} `json:"telemetry"`
		} `json:"service"`
	}
	require.NoError(t, yaml.Unmarshal(data, &cfg))
	port := func(endpoint string) int32 {
		i := strings.LastIndexByte(endpoint, ':')
		require.Positive(t, i, "endpoint %q has a port", endpoint)
		p, err := strconv.ParseInt(endpoint[i+1:], 10, 32)
		require.NoError(t, err, "endpoint %q", endpoint)
		return int32(p)
	}
	add := func(m map[string]int32, name, endpoint string) {
		if endpoint != "" {
			m[name] = port(endpoint)
		}
	}
	rs := cfg.Receivers
	add(c.ports, "hooks http", rs.TokenStream.Hooks.HTTP.Endpoint)
	add(c.udpPorts, "hooks udp", rs.TokenStream.Hooks.UDP.Endpoint)
	c.unixSocket = rs.TokenStream.Hooks.Unix.Endpoint
	c.unixSocketMode, c.unixSocketGroup = rs.TokenStream.Hooks.Unix.SocketMode, rs.TokenStream.Hooks.Unix.SocketGroup
	add(c.ports, "proxy", rs.TokenStream.Proxy.Endpoint)
	add(c.ports, "otlp grpc", rs.OTLP.Protocols.GRPC.Endpoint)
	add(c.ports, "otlp http", rs.OTLP.Protocols.HTTP.Endpoint)
	add(c.ports, "prometheus exporter", cfg.Exporters.Prometheus.Endpoint)
	for _, r := range cfg.Service.Telemetry.Metrics.Readers {
		c.ports["self-telemetry"] = r.Pull.Exporter.Prometheus.Port
	}
	c.health = port(cfg.Extensions["health_check"].Endpoint)
	c.ports["health_check"] = c.health
	return c
}

// containerPort is the number a port reference (a number or a port's name)
// means in container c; 0 for a name c does not have.
func containerPort(c corev1.Container, ref intstr.IntOrString) int32 {
	if ref.Type == intstr.Int {
		return ref.IntVal
	}
	for _, p := range c.Ports {
		if p.Name == ref.StrVal {
			return p.ContainerPort
		}
	}
	return 0
}

// collectorDeployment is the one Deployment of a shape, its otelcol-llm
// container checked against configFile (checkCollectorContainer).
func collectorDeployment(t *testing.T, m manifests, configFile string) (appsv1.Deployment, corev1.Container, collectorConfig) {
	t.Helper()
	cfg := readCollectorConfig(t, configFile)
	require.Len(t, m.deployments, 1)
	d := m.deployments[0]
	assert.Equal(t, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels, "the selector selects the pods")
	c := containerNamed(t, d.Spec.Template.Spec, "otelcol-llm")
	checkCollectorContainer(t, m, d.Spec.Template.Spec, c, cfg, "deploy/"+configFile)
	return d, c, cfg
}

// containerNamed finds a pod's container.
func containerNamed(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// checkCollectorContainer holds a collector container to its config: it is
// given every variable the config reads, exposes every port it listens on,
// probes health_check, and mounts the ConfigMap that is the config.
func checkCollectorContainer(t *testing.T, m manifests, spec corev1.PodSpec, c corev1.Container, cfg collectorConfig, configFile string) {
	t.Helper()
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name)
	}
	for _, name := range cfg.env {
		assert.Contains(t, env, name, "the config reads ${env:%s}", name)
	}
	assert.Contains(t, env, "GOMEMLIMIT")
	require.NotNil(t, c.Resources.Limits.Memory(), "a memory limit")
	assert.False(t, c.Resources.Limits.Memory().IsZero(), "a memory limit")

	ports := map[int32]corev1.ContainerPort{}
	for _, p := range c.Ports {
		ports[p.ContainerPort] = p
	}
	for what, p := range cfg.ports {
		cp, ok := ports[p]
		if assert.True(t, ok, "%s listens on %d: a container port", what, p) {
			assert.Contains(t, []corev1.Protocol{"", corev1.ProtocolTCP}, cp.Protocol, what)
		}
	}
	for what, p := range cfg.udpPorts {
		if cp, ok := ports[p]; assert.True(t, ok, "%s listens on %d/udp", what, p) {
			assert.Equal(t, corev1.ProtocolUDP, cp.Protocol, what)
		}
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, probe, "%s probe", name)
		require.NotNil(t, probe.HTTPGet, "%s probe is an HTTP GET", name)
		assert.Equal(t, "/", probe.HTTPGet.Path, name)
		assert.Equal(t, cfg.health, containerPort(c, probe.HTTPGet.Port), "%s probe on health_check", name)
	}

	// The config comes from the ConfigMap, which is the config file.
	require.Equal(t, []string{"--config", "/etc/otelcol-llm/config.yaml"}, c.Args)
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == "/etc/otelcol-llm" {
			mount = &c.VolumeMounts[i]
		}
	}
	require.NotNil(t, mount, "the config is mounted")
	var cmName string
	for _, v := range spec.Volumes {
		if v.Name == mount.Name && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	var found bool
	for _, cm := range m.configMaps {
		if cm.Name == cmName {
			found = true
			assert.Equal(t, cfg.text, cm.Data["config.yaml"], "ConfigMap %s is %s", cmName, configFile)
		}
	}
	assert.True(t, found, "the ConfigMap %q is in the manifests", cmName)
}

func TestDaemonSetManifests(t *testing.T) {
	m := loadManifests(t, "daemonset")
	cfg := readCollectorConfig(t, "agent-config.yaml")
	require.Len(t, m.daemonSets, 1)
	ds := m.daemonSets[0]
	spec := ds.Spec.Template.Spec
	assert.Equal(t, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels, "the selector selects the pods")
	agent := containerNamed(t, spec, "otelcol-llm")
	checkCollectorContainer(t, m, spec, agent, cfg, "deploy/agent-config.yaml")

	// Engines on the node reach the hooks and OTLP at the node's address.
	for _, what := range []string{"hooks http", "otlp grpc", "otlp http"} {
		for _, p := range agent.Ports {
			if p.ContainerPort == cfg.ports[what] {
				assert.Equal(t, p.ContainerPort, p.HostPort, "%s is published on the node", what)
			}
		}
	}
	for _, p := range agent.Ports {
		if p.ContainerPort == cfg.udpPorts["hooks udp"] {
			assert.Equal(t, p.ContainerPort, p.HostPort, "hooks udp is published on the node")
		}
	}
	// The agent listens on the pod's IP, which the downward API gives.
	for _, e := range agent.Env {
		switch e.Name {
		case "MY_POD_IP":
			assert.Equal(t, "status.podIP", e.ValueFrom.FieldRef.FieldPath)
		case "K8S_NODE_NAME":
			assert.Equal(t, "spec.nodeName", e.ValueFrom.FieldRef.FieldPath)
		case "K8S_POD_NAME":
			assert.Equal(t, "metadata.name", e.ValueFrom.FieldRef.FieldPath)
		case "K8S_NAMESPACE":
			assert.Equal(t, "metadata.namespace", e.ValueFrom.FieldRef.FieldPath)
		}
	}
	// The queue survives the pod: a hostPath where the config puts it.
	var queueDir string
	for _, e := range agent.Env {
		if e.Name == "OTELCOL_LLM_STORAGE_DIR" {
			queueDir = e.Value
		}
	}
	var queueVolume string
	for _, vm := range agent.VolumeMounts {
		if vm.MountPath == queueDir {
			queueVolume = vm.Name
			assert.False(t, vm.ReadOnly)
		}
	}
	require.NotEmpty(t, queueVolume, "OTELCOL_LLM_STORAGE_DIR is a mounted volume")
	for _, v := range spec.Volumes {
		if v.Name == queueVolume {
			assert.NotNil(t, v.HostPath, "the queue is on the node")
		}
	}

	// Pod discovery: the agent's service account may list and watch pods.
	require.Len(t, m.serviceAccounts, 1)
	assert.Equal(t, m.serviceAccounts[0].Name, spec.ServiceAccountName)
	require.Len(t, m.clusterRoles, 1)
	var pods bool
	for _, r := range m.clusterRoles[0].Rules {
		if slices.Contains(r.Resources, "pods") && slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch") {
			pods = true
		}
	}
	assert.True(t, pods, "the ClusterRole lists and watches pods")
	require.Len(t, m.clusterRoleBindings, 1)
	crb := m.clusterRoleBindings[0]
	assert.Equal(t, m.clusterRoles[0].Name, crb.RoleRef.Name)
	require.Len(t, crb.Subjects, 1)
	assert.Equal(t, m.serviceAccounts[0].Name, crb.Subjects[0].Name)
	assert.Equal(t, ds.Namespace, crb.Subjects[0].Namespace)
	assert.Contains(t, cfg.text, "field: spec.nodeName=${env:K8S_NODE_NAME}", "discovery is limited to this node's pods")

	// The example engine sends its hooks to the node's agent, and is
	// selected by the discovery's annotation.
	require.Len(t, m.deployments, 1)
	engine := m.deployments[0].Spec.Template
	assert.Equal(t, "true", engine.Annotations["otelcol-llm/scrape"])
	assert.Contains(t, cfg.text, "__meta_kubernetes_pod_annotation_otelcol_llm_scrape")
	assert.Contains(t, cfg.text, "__meta_kubernetes_pod_annotation_otelcol_llm_metrics_port")
	vllm := containerNamed(t, engine.Spec, "vllm")
	env := map[string]corev1.EnvVar{}
	for _, e := range vllm.Env {
		env[e.Name] = e
	}
	require.Contains(t, env, "NODE_IP")
	assert.Equal(t, "status.hostIP", env["NODE_IP"].ValueFrom.FieldRef.FieldPath)
	// Its hooks go over the agent's Unix socket: the same directory of the
	// node mounted in both pods, where the config puts the socket.
	require.NotEmpty(t, cfg.unixSocket, "the agent offers the Unix socket")
	assert.Equal(t, "unix://"+cfg.unixSocket, env["OTELCOL_LLM_HOOK_ENDPOINT"].Value)
	agentDir := hostPathAt(t, spec, agent, path.Dir(cfg.unixSocket))
	assert.Equal(t, agentDir, hostPathAt(t, engine.Spec, vllm, path.Dir(cfg.unixSocket)), "the engine mounts the agent's socket directory")
	checkSocketAccess(t, cfg, spec, agent, engine.Spec, vllm)
	assert.Contains(t, strings.Join(vllm.Args, " "), "http://$(NODE_IP):"+strconv.Itoa(int(cfg.ports["otlp grpc"])),
		"engine spans to the agent's OTLP")
	metricsPort, err := strconv.ParseInt(engine.Annotations["otelcol-llm/metrics-port"], 10, 32)
	require.NoError(t, err)
	assert.Equal(t, int32(metricsPort), vllm.Ports[0].ContainerPort)
}

func TestSidecarManifests(t *testing.T) {
	m := loadManifests(t, "sidecar")
	d, sidecar, cfg := collectorDeployment(t, m, "sidecar-config.yaml")

	// The Service sends clients through the proxy, which forwards to vLLM
	// on localhost.
	require.Len(t, m.services, 1)
	svc := m.services[0]
	assert.Equal(t, d.Spec.Template.Labels, svc.Spec.Selector)
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, cfg.ports["proxy"], containerPort(sidecar, svc.Spec.Ports[0].TargetPort), "the Service targets the proxy")
	vllm := containerNamed(t, d.Spec.Template.Spec, "vllm")
	assert.Contains(t, cfg.text, "endpoint: http://localhost:8000", "the proxy's upstream is vLLM in the pod")
	assert.Contains(t, strings.Join(vllm.Args, " "), "--port 8000")
	assert.True(t, *sidecar.SecurityContext.RunAsNonRoot)

	// The hooks' socket is in an emptyDir both containers mount.
	require.NotEmpty(t, cfg.unixSocket)
	dir := path.Dir(cfg.unixSocket)
	vol := func(c corev1.Container) string {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == dir {
				return vm.Name
			}
		}
		return ""
	}
	require.NotEmpty(t, vol(sidecar), "the sidecar mounts %s", dir)
	assert.Equal(t, vol(sidecar), vol(vllm), "vLLM mounts the sidecar's socket directory")
	checkSocketAccess(t, cfg, d.Spec.Template.Spec, sidecar, d.Spec.Template.Spec, vllm)
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == vol(sidecar) {
			assert.NotNil(t, v.EmptyDir, "the socket's directory is the pod's own")
		}
	}
}

// groups are the group IDs a container runs with: its (or its pod's)
// runAsGroup, the pod's fsGroup and supplementalGroups.
func groups(spec corev1.PodSpec, c corev1.Container) []int64 {
	var out []int64
	if c.SecurityContext != nil && c.SecurityContext.RunAsGroup != nil {
		out = append(out, *c.SecurityContext.RunAsGroup)
	}
	if p := spec.SecurityContext; p != nil {
		if p.RunAsGroup != nil {
			out = append(out, *p.RunAsGroup)
		}
		if p.FSGroup != nil {
			out = append(out, *p.FSGroup)
		}
		out = append(out, p.SupplementalGroups...)
	}
	return out
}

// checkSocketAccess holds the hooks' Unix socket to who may connect: no
// other user of the node (socket_mode grants others nothing), the engine
// (a member of socket_group), and the collector can give the socket that
// group (a member of it too, as no capability is left it).
func checkSocketAccess(t *testing.T, cfg collectorConfig, collectorSpec corev1.PodSpec, collector corev1.Container, engineSpec corev1.PodSpec, engine corev1.Container) {
	t.Helper()
	mode, err := strconv.ParseUint(cfg.unixSocketMode, 8, 32)
	require.NoError(t, err, "socket_mode %q is set, in octal", cfg.unixSocketMode)
	assert.Zero(t, mode&0o007, "socket_mode %q: other users of the node may not connect", cfg.unixSocketMode)
	assert.NotZero(t, mode&0o020, "socket_mode %q: the group may connect", cfg.unixSocketMode)
	gid, err := strconv.ParseInt(cfg.unixSocketGroup, 10, 64)
	require.NoError(t, err, "socket_group %q is a numeric ID, the same on every node", cfg.unixSocketGroup)
	assert.Contains(t, groups(collectorSpec, collector), gid, "the collector is a member of socket_group, so it may give the socket to it")
	assert.Contains(t, groups(engineSpec, engine), gid, "the engine is a member of socket_group, so it may connect")
}

// hostPathAt is the node's directory that container c of spec mounts at
// dir (a hostPath volume).
func hostPathAt(t *testing.T, spec corev1.PodSpec, c corev1.Container, dir string) string {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != dir {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name {
				require.NotNil(t, v.HostPath, "%s is a hostPath", dir)
				return v.HostPath.Path
			}
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, dir)
	return ""
}

func TestGatewayManifests(t *testing.T) {
	m := loadManifests(t, "gateway")
	d, _, cfg := collectorDeployment(t, m, "gateway.yaml")

	// The agents resolve the gateways through a headless Service on their
	// OTLP port.
	require.Len(t, m.services, 1)
	svc := m.services[0]
	assert.Equal(t, corev1.ClusterIPNone, svc.Spec.ClusterIP, "headless: the agents route to each gateway")
	assert.Equal(t, d.Spec.Template.Labels, svc.Spec.Selector)
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, cfg.ports["otlp grpc"], svc.Spec.Ports[0].Port)
	var lb struct {
		Exporters map[string]struct {
			Resolver struct {
				K8s struct {
					Service string  `json:"service"`
					Ports   []int32 `json:"ports"`
				} `json:"k8s"`
			} `json:"resolver"`
		} `json:"exporters"`
	}
	lbText, err := os.ReadFile("agent-lb.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(lbText, &lb))
	require.NotEmpty(t, lb.Exporters)
	for name, e := range lb.Exporters {
		assert.Equal(t, svc.Name+"."+svc.Namespace, e.Resolver.K8s.Service, "%s resolves the gateways' Service", name)
		assert.Equal(t, []int32{svc.Spec.Ports[0].Port}, e.Resolver.K8s.Ports, name)
	}
	var found bool
	for _, cm := range m.configMaps {
		if cm.Name == "otelcol-llm-agent-lb" {
			found = true
			assert.Equal(t, string(lbText), cm.Data["agent-lb.yaml"], "the ConfigMap is deploy/agent-lb.yaml")
		}
	}
	assert.True(t, found, "the agents' agent-lb.yaml ConfigMap")

	// The agents' service account may watch the gateways' EndpointSlices.
	agents := loadManifests(t, "daemonset")
	require.Len(t, m.roles, 1)
	require.Len(t, m.roleBindings, 1)
	assert.Equal(t, svc.Namespace, m.roles[0].Namespace)
	var watchesEndpointSlices bool
	for _, r := range m.roles[0].Rules {
		if slices.Contains(r.Resources, "endpointslices") && slices.Contains(r.Verbs, "watch") && slices.Contains(r.Verbs, "list") {
			watchesEndpointSlices = true
		}
	}
	assert.True(t, watchesEndpointSlices, "the Role lists and watches endpointslices")
	rb := m.roleBindings[0]
	assert.Equal(t, m.roles[0].Name, rb.RoleRef.Name)
	require.Len(t, rb.Subjects, 1)
	assert.Equal(t, agents.serviceAccounts[0].Name, rb.Subjects[0].Name)
	assert.Equal(t, agents.serviceAccounts[0].Namespace, rb.Subjects[0].Namespace)
}
