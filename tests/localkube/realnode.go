package main

// The real node (--real-node): instead of the fake node, a kubelet runs in
// this process (k8s.io/kubernetes/cmd/kubelet/app, from the same modules as
// the control plane) and runs pods as real containers through containerd
// (started as a child process, built by tests/tools/build-realnode.sh) and
// runc, with the CNI bridge plugin for pod networking. localkube still binds
// pods to the node itself (there is no scheduler), as the fake node does.
//
// Everything the node starts lives under the cgroup /localkube-<id> in every
// cgroup v1 hierarchy (containerd and its shims in .../runtime, pods in
// .../kubepods), so stopping the node can remove the pods through the CRI and
// then kill whatever is left by cgroup, without touching other processes.
//
// No traffic leaves the machine: the node refuses to start unless its network
// namespace holds nothing but loopback and its own bridge (run it under
// tests/loopback-only); pods get addresses on that bridge, so they reach each
// other and the node's namespace, and nothing else exists to reach.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	kubeletoptions "k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
)

// realNodeConfig is what --real-node needs besides the common flags.
type realNodeConfig struct {
	containerd   string   // the containerd binary (ctr and containerd-shim-runc-v2 beside it)
	runc         string   // the runc binary
	cniBinDir    string   // where the CNI plugins are (bridge, host-local, loopback, portmap)
	sandboxImage string   // the pod sandbox ("pause") image, loaded from loadImages
	loadImages   []string // OCI archives imported into the node's containerd before it is ready
}

// realNode is one running node: its paths, names and child processes.
type realNode struct {
	cfg      realNodeConfig
	dataDir  string // <data-dir>/node
	name     string
	id       string // short and stable per data dir: names the cgroup, the bridge and the subnet
	cgroup   string // "/localkube-<id>"
	bridge   string
	gateway  string // the bridge's address and the node's InternalIP
	subnet   string
	endpoint string // containerd's CRI socket, unix://...

	containerd     *exec.Cmd
	containerdDone <-chan error
	sysctls        map[string]string // the machine's values of kubeletSysctls before the kubelet started
}

// kubeletSysctls are the machine-wide kernel settings a kubelet sets when it
// starts (vm.overcommit_memory=1, kernel.panic_on_oops=1, ...; its
// protectKernelDefaults would refuse to start instead). They are not
// namespaced: on a shared test machine they would change how every other
// process runs, so localkube puts the machine's values back once the node is
// Ready (the kubelet only sets them at start).
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

func readSysctls() map[string]string {
	values := map[string]string{}
	for _, key := range kubeletSysctls {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", key)); err == nil {
			values[key] = strings.TrimSpace(string(v))
		}
	}
	return values
}

// restoreSysctls writes back the values read before the kubelet started.
func (n *realNode) restoreSysctls() {
	for key, want := range n.sysctls {
		path := filepath.Join("/proc/sys", key)
		if v, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(v)) != want {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				logf("restoring %s to %s: %v", path, want, err)
			}
		}
	}
}

// defaultContainerd is where tests/tools/build-realnode.sh puts containerd
// relative to build.sh's localkube: <repo>/target/tools/ beside
// <repo>/target/localkube/.
func defaultContainerd() string {
	exe, err := os.Executable()
	if err != nil {
		return "containerd"
	}
	return filepath.Join(filepath.Dir(exe), "..", "tools", "containerd")
}

func newRealNode(cfg realNodeConfig, dataDir, name string) *realNode {
	h := fnv.New32a()
	h.Write([]byte(dataDir))
	sum := h.Sum32()
	octet := 1 + sum%250
	id := fmt.Sprintf("%08x", sum)
	dir := filepath.Join(dataDir, "node")
	return &realNode{
		cfg:      cfg,
		dataDir:  dir,
		name:     name,
		id:       id,
		cgroup:   "/localkube-" + id,
		bridge:   "lkbr" + id[:6],
		gateway:  fmt.Sprintf("10.88.%d.1", octet),
		subnet:   fmt.Sprintf("10.88.%d.0/24", octet),
		endpoint: "unix://" + filepath.Join(dir, "containerd", "containerd.sock"),
	}
}

// cgroupV1Controllers are the hierarchies the kubelet and runc need on a
// cgroup v1 machine (hugetlb is optional for both).
var cgroupV1Controllers = []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "pids", "blkio"}

// checkMachine tells, in one error listing every gap, why this machine cannot
// run the real node; nil when it can.
func (n *realNode) checkMachine() error {
	var gaps []string
	if os.Geteuid() != 0 {
		gaps = append(gaps, "it must run as root (containerd, runc, cgroups, mounts, network namespaces)")
	}
	for _, c := range cgroupV1Controllers {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "cgroup.procs")); err != nil {
			gaps = append(gaps, fmt.Sprintf("cgroup v1 hierarchy /sys/fs/cgroup/%s is not mounted", c))
		}
	}
	for _, bin := range []string{n.cfg.containerd, n.ctrPath(), n.shimPath(), n.cfg.runc} {
		if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
			gaps = append(gaps, fmt.Sprintf("%s is missing or not executable", bin))
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(n.cfg.cniBinDir, plugin)); err != nil {
			gaps = append(gaps, fmt.Sprintf("CNI plugin %s is not in %s (apt-get install containernetworking-plugins)", plugin, n.cfg.cniBinDir))
		}
	}
	for _, image := range n.cfg.loadImages {
		if _, err := os.Stat(image); err != nil {
			gaps = append(gaps, fmt.Sprintf("image archive %s: %v (build it with deploy/images/build.sh)", image, err))
		}
	}
	if err := n.checkNetworkNamespace(); err != nil {
		gaps = append(gaps, err.Error())
	}
	if len(gaps) > 0 {
		return fmt.Errorf("--real-node cannot run here:\n  - %s", strings.Join(gaps, "\n  - "))
	}
	return nil
}

// checkNetworkNamespace refuses a namespace with any interface but loopback,
// this node's bridge and the pods' veth ends: pods could reach through it.
func (n *realNode) checkNetworkNamespace() error {
	ifaces, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("listing network interfaces: %w", err)
	}
	var others []string
	for _, i := range ifaces {
		if i.Flags&net.FlagLoopback != 0 || strings.HasPrefix(i.Name, "lkbr") || strings.HasPrefix(i.Name, "veth") {
			continue
		}
		others = append(others, i.Name)
	}
	if len(others) > 0 {
		return fmt.Errorf("the network namespace has interfaces besides loopback (%s): pods could reach off the machine; "+
			"run localkube --real-node inside tests/loopback-only", strings.Join(others, ", "))
	}
	return nil
}

func (n *realNode) ctrPath() string { return filepath.Join(filepath.Dir(n.cfg.containerd), "ctr") }
func (n *realNode) shimPath() string {
	return filepath.Join(filepath.Dir(n.cfg.containerd), "containerd-shim-runc-v2")
}

// start brings up the cgroups, the bridge and containerd, and loads the images.
// The kubelet is started separately (runKubelet), once the API server is up.
func (n *realNode) start(ctx context.Context) error {
	if err := n.checkMachine(); err != nil {
		return err
	}
	for _, dir := range []string{"containerd", "cni", "kubelet", "logs"} {
		if err := os.MkdirAll(filepath.Join(n.dataDir, dir), 0o700); err != nil {
			return err
		}
	}
	if err := n.createCgroups(); err != nil {
		return err
	}
	if err := n.createBridge(); err != nil {
		return err
	}
	if err := n.writeCNIConfig(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	for _, image := range n.cfg.loadImages {
		if err := n.importImage(ctx, image); err != nil {
			return err
		}
	}
	return nil
}

// createCgroups makes /localkube-<id> and its runtime child in every cgroup v1
// hierarchy: the kubelet requires its cgroup root to exist in all of them.
func (n *realNode) createCgroups() error {
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		dir := filepath.Join(h, n.cgroup, "runtime")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			// A new cpuset cgroup has no CPUs or memory nodes; copy the parent's.
			if err := inheritCpuset(h, n.cgroup); err != nil {
				return err
			}
		}
	}
	return nil
}

// cgroupHierarchies lists the mounted cgroup v1 hierarchies (/sys/fs/cgroup/X).
func cgroupHierarchies() ([]string, error) {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "cgroup" {
			out = append(out, f[1])
		}
	}
	return out, nil
}

func inheritCpuset(root, cgroup string) error {
	for _, rel := range []string{cgroup, filepath.Join(cgroup, "runtime")} {
		dir := filepath.Join(root, rel)
		for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, _ := os.ReadFile(filepath.Join(dir, file))
			if len(bytes.TrimSpace(cur)) > 0 {
				continue
			}
			parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), file))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, file), parent, 0o644); err != nil {
				return fmt.Errorf("setting %s/%s: %w", dir, file, err)
			}
		}
	}
	return nil
}

// createBridge creates the pods' bridge with the node's address before any
// pod exists: the kubelet needs a non-loopback address on the node to report
// as its InternalIP (it refuses loopback), and the CNI bridge plugin reuses
// the bridge it finds.
func (n *realNode) createBridge() error {
	if _, err := net.InterfaceByName(n.bridge); err != nil {
		if out, err := exec.Command("ip", "link", "add", n.bridge, "type", "bridge").CombinedOutput(); err != nil {
			return fmt.Errorf("ip link add %s type bridge: %v: %s", n.bridge, err, out)
		}
	}
	out, err := exec.Command("ip", "addr", "replace", n.gateway+"/24", "dev", n.bridge).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip addr replace %s/24 dev %s: %v: %s", n.gateway, n.bridge, err, out)
	}
	if out, err := exec.Command("ip", "link", "set", n.bridge, "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set %s up: %v: %s", n.bridge, err, out)
	}
	return nil
}

// writeCNIConfig writes the one network: the bridge with host-local
// addresses, no IP masquerade (there is nowhere to masquerade to), and
// portmap for hostPort.
func (n *realNode) writeCNIConfig() error {
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "localkube",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
`, n.bridge, n.subnet, n.gateway, filepath.Join(n.dataDir, "cni", "ipam"))
	dir := filepath.Join(n.dataDir, "cni", "net.d")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "10-localkube.conflist"), []byte(conf), 0o600)
}

// containerdConfig is containerd 2.x's configuration (version 3) for this node.
func (n *realNode) containerdConfig() string {
	dir := filepath.Join(n.dataDir, "containerd")
	return fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""

[metrics]
  address = ""

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  # No container may ask for a lower OOM score than containerd's: lowering it
  # needs CAP_SYS_RESOURCE, which this project's virtual machines do not grant
  # even to root (the kubelet asks -998 for every pod's sandbox).
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        Root = %q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		strings.TrimPrefix(n.endpoint, "unix://"), filepath.Join(dir, "ttrpc.sock"),
		n.cfg.sandboxImage, n.cfg.runc, filepath.Join(dir, "runc"), n.cfg.cniBinDir, filepath.Join(n.dataDir, "cni", "net.d"))
}

// startContainerd starts containerd in the node's runtime cgroup and waits
// until it serves.
func (n *realNode) startContainerd(ctx context.Context) error {
	configPath := filepath.Join(n.dataDir, "containerd", "config.toml")
	if err := writeFileAtomic(configPath, []byte(n.containerdConfig()), 0o600); err != nil {
		return err
	}
	logPath := filepath.Join(n.dataDir, "logs", "containerd.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.cfg.containerd, "--config", configPath, "--log-level", "warn")
	// The shim and runc are found through PATH; the shim is beside containerd.
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(n.cfg.containerd)+":"+filepath.Dir(n.cfg.runc)+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group (a Ctrl-C to localkube's does not reach it first),
	// and killed if localkube dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", n.cfg.containerd, err)
	}
	n.containerd = cmd
	done := make(chan error, 1)
	n.containerdDone = done
	go func() { done <- cmd.Wait(); logFile.Close() }()
	if err := n.moveToCgroup(cmd.Process.Pid, "runtime"); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := n.ctr(ctx, "version"); err == nil {
			logf("containerd serving at %s (log: %s)", n.endpoint, logPath)
			return nil
		}
		select {
		case err := <-n.containerdDone:
			n.containerdDone = closedWith(err)
			return fmt.Errorf("containerd exited (%v); see %s", err, logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not serve at %s within 30s; see %s", n.endpoint, logPath)
		}
	}
}

// moveToCgroup puts pid into <node cgroup>/<child> in every hierarchy.
func (n *realNode) moveToCgroup(pid int, child string) error {
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hierarchies {
		procs := filepath.Join(h, n.cgroup, child, "cgroup.procs")
		if err := os.WriteFile(procs, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("moving containerd (pid %d) to %s: %w", pid, procs, err)
		}
	}
	return nil
}

// ctr runs containerd's own client against this node's containerd, in the
// namespace the CRI uses.
func (n *realNode) ctr(ctx context.Context, args ...string) error {
	full := append([]string{"--address", strings.TrimPrefix(n.endpoint, "unix://"), "--namespace", "k8s.io"}, args...)
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(callCtx, n.ctrPath(), full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// importImage loads an OCI archive (deploy/images/build.sh writes them) under
// the names its index gives.
func (n *realNode) importImage(ctx context.Context, archive string) error {
	started := time.Now()
	if err := n.ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("loading image archive %s: %w", archive, err)
	}
	logf("loaded %s into the node's containerd in %v", archive, time.Since(started).Round(time.Millisecond))
	return nil
}

// kubeletServer is the kubelet's configuration: the defaults of its v1beta1
// configuration file, with what this node needs (see README.md, "The real
// node").
func (n *realNode) kubeletServer(kubeconfig, caFile string, port int) (*kubeletoptions.KubeletServer, error) {
	kc, err := kubeletoptions.NewKubeletConfiguration()
	if err != nil {
		return nil, err
	}
	// cgroup v1: Kubernetes 1.35+ refuses it unless told not to.
	kc.FailCgroupV1 = false
	kc.CgroupDriver = "cgroupfs"
	kc.CgroupRoot = n.cgroup
	kc.CgroupsPerQOS = true
	kc.ContainerRuntimeEndpoint = n.endpoint
	kc.Address = "127.0.0.1"
	kc.Port = int32(port)
	kc.ReadOnlyPort = 0
	kc.HealthzPort = 0
	kc.Authentication.Anonymous.Enabled = false
	kc.Authentication.Webhook.Enabled = false
	kc.Authentication.X509.ClientCAFile = caFile
	kc.Authorization.Mode = kubeletconfig.KubeletAuthorizationModeAlwaysAllow
	// A shared test machine: swap may be on, its disk may be fuller than a
	// production node's; neither may stop pods or delete the loaded images
	// (they cannot be pulled again).
	kc.FailSwapOn = false
	kc.EvictionHard = map[string]string{"memory.available": "100Mi"}
	kc.ImageGCHighThresholdPercent = 100
	kc.ImageGCLowThresholdPercent = 99
	// No name servers in pods: the machine's would be off the machine, which
	// pods cannot reach (and must not try to).
	kc.ResolverConfig = ""
	kc.NodeStatusUpdateFrequency = metav1.Duration{Duration: 10 * time.Second}
	kc.SyncFrequency = metav1.Duration{Duration: 10 * time.Second}
	kc.FileCheckFrequency = metav1.Duration{Duration: time.Minute}

	flags := kubeletoptions.NewKubeletFlags()
	flags.KubeConfig = kubeconfig
	flags.HostnameOverride = n.name
	flags.NodeIP = n.gateway
	flags.RootDirectory = filepath.Join(n.dataDir, "kubelet")
	kc.PodLogsDir = filepath.Join(n.dataDir, "pod-logs") // not the machine's /var/log/pods
	flags.CertDirectory = filepath.Join(n.dataDir, "kubelet", "pki")
	flags.NodeLabels = map[string]string{"localkube.windvane.dev/real-node": "true"}
	return &kubeletoptions.KubeletServer{KubeletFlags: *flags, KubeletConfiguration: *kc}, nil
}

// runKubelet runs the kubelet until ctx ends; the returned channel yields its
// error (nil when it stopped with ctx).
func (n *realNode) runKubelet(ctx context.Context, kubeconfig, caFile string) (<-chan error, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s, err := n.kubeletServer(kubeconfig, caFile, port)
	if err != nil {
		return nil, err
	}
	n.sysctls = readSysctls()
	deps, err := kubeletapp.UnsecuredDependencies(ctx, s, utilfeature.DefaultFeatureGate)
	if err != nil {
		return nil, fmt.Errorf("kubelet dependencies: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		err := kubeletapp.Run(ctx, s, deps, utilfeature.DefaultFeatureGate)
		if ctx.Err() != nil {
			err = nil
		}
		done <- err
	}()
	logf("kubelet started for node %s (port %d, root %s)", n.name, port, s.RootDirectory)
	return done, nil
}

// nodeReady is true once the kubelet registered the node and reports it Ready
// (the runtime and its network are up).
func nodeReady(ctx context.Context, client kubernetes.Interface, name string) (bool, error) {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, nil
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// stop removes the pods' containers and sandboxes (so their network and
// mounts are released), stops containerd, kills whatever is left in the
// node's cgroup and removes it, and unmounts what is left under the data dir.
func (n *realNode) stop() {
	if n.containerd != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		n.removePods(ctx)
		cancel()
		_ = n.containerd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.containerdDone:
		case <-time.After(10 * time.Second):
			_ = n.containerd.Process.Kill()
			<-n.containerdDone
		}
	}
	n.killCgroup()
	unmountUnder(n.dataDir)
	n.restoreSysctls()
}

// removePods stops and removes every pod sandbox through containerd's CRI, as
// the kubelet would for deleted pods: their containers stop, and the CNI
// plugins release their addresses and network namespaces.
func (n *realNode) removePods(ctx context.Context) {
	// The CRI's gRPC API directly (not k8s.io/cri-client, whose constructor
	// changes between the Kubernetes releases localkube builds for).
	conn, err := grpc.NewClient(n.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		logf("removing the node's pods: %v", err)
		return
	}
	defer conn.Close()
	runtime := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		logf("removing the node's pods: listing sandboxes: %v", err)
		return
	}
	for _, sb := range list.Items {
		pod := sb.Metadata.Namespace + "/" + sb.Metadata.Name
		if _, err := runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			logf("stopping the sandbox of pod %s: %v", pod, err)
		}
		if _, err := runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			logf("removing the sandbox of pod %s: %v", pod, err)
		}
	}
}

// killCgroup kills every process left in the node's cgroup tree (the pids
// hierarchy lists them all) and removes the cgroups, deepest first.
func (n *realNode) killCgroup() {
	hierarchies, err := cgroupHierarchies()
	if err != nil {
		return
	}
	for attempt := 0; attempt < 50; attempt++ {
		left := 0
		_ = filepath.WalkDir(filepath.Join("/sys/fs/cgroup/pids", n.cgroup), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					left++
				}
			}
			return nil
		})
		if left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, h := range hierarchies {
		removeCgroupTree(filepath.Join(h, n.cgroup))
	}
}

func removeCgroupTree(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
		klog.V(1).Infof("localkube: removing cgroup %s: %v", dir, err)
	}
}

// unmountUnder detaches every mount below dir, deepest first: the kubelet's
// volumes and containerd's snapshots would otherwise keep the data dir busy.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}
