package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
)

// readyPrefix starts the one line localkube prints on stdout.
const readyPrefix = "LOCALKUBE_READY "

// readyInfo is the JSON document on the ready line.
type readyInfo struct {
	Server     string `json:"server"`
	Kubeconfig string `json:"kubeconfig"`
	DataDir    string `json:"dataDir"`
	Node       string `json:"node"`
	Pid        int    `json:"pid"`
}

type config struct {
	dataDir          string
	port             int
	kubeconfigOut    string
	nodeName         string
	controllers      string
	verbosity        int
	logThreshold     string
	readyTimeout     time.Duration
	exitWithStdin    bool
	removeOnStdinEOF bool
	profiling        bool
	realNode         bool
	node             realNodeConfig
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("localkube", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.StringVar(&c.dataDir, "data-dir", "", "directory for certificates, etcd data and the kubeconfig (required; reused on restart)")
	fs.IntVar(&c.port, "port", 0, "kube-apiserver HTTPS port on 127.0.0.1 (0 = pick a free port)")
	fs.StringVar(&c.kubeconfigOut, "kubeconfig-out", "", "where to write the admin kubeconfig (default <data-dir>/admin.kubeconfig)")
	fs.StringVar(&c.nodeName, "node-name", "localkube-node", "name of the fake Node")
	fs.StringVar(&c.controllers, "controllers", defaultControllers, "kube-controller-manager --controllers")
	fs.IntVar(&c.verbosity, "v", 0, "klog verbosity of the control plane components")
	fs.StringVar(&c.logThreshold, "log-threshold", "WARNING", "least severe control plane log messages written (INFO, WARNING, ERROR); localkube's own messages are always written")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 2*time.Minute, "give up (exit 1) if not ready within this time")
	fs.BoolVar(&c.exitWithStdin, "exit-with-stdin", false, "shut down when stdin reaches end of file (the parent died or closed it)")
	fs.BoolVar(&c.profiling, "profiling", false, "serve Go's profiles of the whole process (etcd and the control plane) at the apiserver's /debug/pprof/ (cluster-admin only)")
	fs.BoolVar(&c.removeOnStdinEOF, "remove-data-dir-on-stdin-eof", false, "like --exit-with-stdin, and also delete --data-dir after shutting down that way")
	fs.BoolVar(&c.realNode, "real-node", false, "run a real kubelet with containerd and runc instead of the fake node (root, cgroup v1 or v2, inside tests/loopback-only; see README.md)")
	fs.StringVar(&c.node.containerd, "containerd", defaultContainerd(), "--real-node: the containerd binary (ctr and containerd-shim-runc-v2 beside it; tests/tools/build-realnode.sh builds them)")
	fs.StringVar(&c.node.runc, "runc", "/usr/sbin/runc", "--real-node: the runc binary")
	fs.StringVar(&c.node.cniBinDir, "cni-bin-dir", "/usr/lib/cni", "--real-node: the CNI plugins' directory")
	fs.StringVar(&c.node.sandboxImage, "sandbox-image", "docker.io/windvane-test/pause:local", "--real-node: the pod sandbox image (it must be loaded with --load-image: nothing is pulled)")
	fs.Func("load-image", "--real-node: an OCI image archive to load into the node's containerd (repeatable; deploy/images/build.sh builds them)", func(v string) error {
		abs, err := filepath.Abs(v)
		c.node.loadImages = append(c.node.loadImages, abs)
		return err
	})
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: localkube --data-dir DIR [flags]\n       localkube kubectl [kubectl args]\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() != 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if c.dataDir == "" {
		return c, errors.New("--data-dir is required")
	}
	abs, err := filepath.Abs(c.dataDir)
	if err != nil {
		return c, err
	}
	c.dataDir = abs
	if !c.realNode && len(c.node.loadImages) > 0 {
		return c, errors.New("--load-image needs --real-node")
	}
	if c.kubeconfigOut == "" {
		c.kubeconfigOut = filepath.Join(c.dataDir, "admin.kubeconfig")
	}
	if c.kubeconfigOut, err = filepath.Abs(c.kubeconfigOut); err != nil {
		return c, err
	}
	return c, nil
}

// checkBuildMinor refuses to start when the version stamp (set by build.sh
// from the module file) names another minor than the sources were compiled
// for (the k8s134 build tag), so a mixed-up build cannot pass for the other
// release. An unstamped `go build` has no minor and is let through.
func checkBuildMinor() error {
	if stamped := version.Get().Minor; stamped != "" && stamped != kubeMinor {
		return fmt.Errorf("built for Kubernetes 1.%s but stamped %s: build with tests/localkube/build.sh --version 1.%s",
			kubeMinor, version.Get().GitVersion, stamped)
	}
	return nil
}

func setupLogging(verbosity int, threshold string) error {
	// Several components share the process; none of them may reconfigure the
	// global logging they all use.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	settings := klogStderrSettings()
	settings["v"] = strconv.Itoa(verbosity)
	settings["stderrthreshold"] = threshold
	for name, value := range settings {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("klog -%s=%s: %w", name, value, err)
		}
	}
	return nil
}

// logf writes one of localkube's own messages to stderr, whatever the klog
// threshold.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s localkube: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func runLocalkube(args []string) int {
	// stdout carries exactly the ready line; anything in this process that
	// writes to os.Stdout goes to stderr instead.
	readyOut := os.Stdout
	os.Stdout = os.Stderr

	if err := checkBuildMinor(); err != nil {
		fmt.Fprintf(os.Stderr, "localkube: %v\n", err)
		return 2
	}
	c, err := parseFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "localkube: %v\n", err)
		return 2
	}
	if err := setupLogging(c.verbosity, c.logThreshold); err != nil {
		fmt.Fprintf(os.Stderr, "localkube: %v\n", err)
		return 2
	}
	defer klog.Flush()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go collectOnRequest(ctx, c.dataDir)
	var orphaned atomic.Bool
	if c.exitWithStdin || c.removeOnStdinEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			logf("stdin closed, shutting down")
			orphaned.Store(true)
			stop()
		}()
	}

	cleanup := func() {
		if orphaned.Load() && c.removeOnStdinEOF {
			// The owner is gone and nobody will restart this instance or
			// clean up after it.
			if err := os.RemoveAll(c.dataDir); err != nil {
				logf("removing %s: %v", c.dataDir, err)
			}
		}
	}
	// Components exit the process through klog.Fatal when they fail; some
	// also do when they are stopped halfway through starting (a post-start
	// hook of kube-apiserver, for instance). After a shutdown request that is
	// part of stopping, not a failure.
	klog.OsExit = func(code int) {
		if ctx.Err() != nil {
			logf("a component exited while shutting down; stopped")
			cleanup()
			os.Exit(0)
		}
		os.Exit(code)
	}

	err = run(ctx, c, readyOut)
	cleanup()
	if err != nil && ctx.Err() == nil {
		klog.Flush()
		logf("error: %v", err)
		return 1
	}
	if err != nil {
		logf("stopped before it was ready (%v)", err)
	} else {
		logf("stopped")
	}
	return 0
}

// run starts everything, reports readiness, waits for ctx, then stops
// everything in reverse order.
func run(ctx context.Context, c config, readyOut io.Writer) error {
	started := time.Now()
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return err
	}
	p, err := ensurePKI(c.dataDir)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)))
	if err != nil {
		return fmt.Errorf("listening for kube-apiserver: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	server := fmt.Sprintf("https://127.0.0.1:%d", port)

	var realNode *realNode
	if c.realNode {
		// Started first: it checks the machine, and fails before anything else runs.
		realNode = newRealNode(c.node, c.dataDir, c.nodeName)
		defer realNode.stop()
		if err := realNode.start(ctx); err != nil {
			ln.Close()
			return err
		}
	}

	etcd, etcdURL, err := startEtcd(c.dataDir)
	if err != nil {
		ln.Close()
		return err
	}
	defer func() {
		// Close blocks until etcd has stopped; do not hang forever on it.
		closed := make(chan struct{})
		go func() { etcd.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			logf("etcd did not stop within 10s")
		}
	}()
	klog.V(1).Infof("localkube: etcd serving on %s", etcdURL)

	internalKubeconfig := filepath.Join(c.dataDir, "admin.kubeconfig")
	if err := writeKubeconfig(internalKubeconfig, server, p); err != nil {
		ln.Close()
		return err
	}
	if c.kubeconfigOut != internalKubeconfig {
		if err := writeKubeconfig(c.kubeconfigOut, server, p); err != nil {
			ln.Close()
			return err
		}
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", internalKubeconfig)
	if err != nil {
		ln.Close()
		return err
	}
	restConfig.QPS, restConfig.Burst = 100, 200
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(restConfig, "localkube"))
	if err != nil {
		ln.Close()
		return err
	}

	egress, egressConfig, err := startEgressGuard(c.dataDir)
	if err != nil {
		ln.Close()
		return err
	}
	// Deferred first, so it runs last: the API server stops dialling before
	// its way out closes.
	defer egress.stop()

	apiCtx, stopAPI := context.WithCancel(context.Background())
	defer stopAPI()
	apiDone, err := startAPIServer(apiCtx, ln, etcdURL, p, egressConfig, c.profiling)
	if err != nil {
		ln.Close()
		return err
	}
	defer func() {
		stopAPI()
		select {
		case <-apiDone:
		case <-time.After(15 * time.Second):
			logf("kube-apiserver did not stop within 15s")
		}
	}()

	deadline, cancelDeadline := context.WithTimeout(ctx, c.readyTimeout)
	defer cancelDeadline()
	if err := waitFor(deadline, apiDone, "kube-apiserver /readyz", func(ctx context.Context) (bool, error) {
		var code int
		res := client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&code)
		return code == http.StatusOK && res.Error() == nil, nil
	}); err != nil {
		return err
	}
	logf("kube-apiserver ready after %v", time.Since(started).Round(time.Millisecond))

	compCtx, stopComponents := context.WithCancel(context.Background())
	defer stopComponents()
	kcmDone, err := startControllerManager(compCtx, internalKubeconfig, c.controllers, p)
	if err != nil {
		return err
	}
	defer func() {
		stopComponents()
		select {
		case <-kcmDone:
		case <-time.After(10 * time.Second):
			logf("kube-controller-manager did not stop within 10s")
		}
	}()

	node := &fakeNode{client: client, name: c.nodeName, bindOnly: c.realNode}
	var kubeletDone <-chan error // nil (never ready) without a real node
	if c.realNode {
		if kubeletDone, err = realNode.runKubelet(compCtx, internalKubeconfig, p.caCert()); err != nil {
			return err
		}
	} else if err := waitFor(deadline, apiDone, "node registration", func(ctx context.Context) (bool, error) {
		if err := node.register(ctx); err != nil {
			klog.V(1).Infof("localkube: %v (retrying)", err)
			return false, nil
		}
		return true, nil
	}); err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	if err := node.run(compCtx, factory); err != nil {
		return err
	}
	defer func() {
		// Informers stop with compCtx; Shutdown waits for them.
		stopComponents()
		factory.Shutdown()
	}()
	if c.realNode {
		if err := waitFor(deadline, apiDone, "the real node's kubelet to report the node Ready", func(ctx context.Context) (bool, error) {
			select {
			case err := <-kubeletDone:
				kubeletDone = closedWith(err)
				return false, fmt.Errorf("the kubelet stopped: %v", err)
			default:
			}
			return nodeReady(ctx, client, c.nodeName)
		}); err != nil {
			return err
		}
		realNode.restoreSysctls()
	}

	if err := waitFor(deadline, apiDone, "default ServiceAccount", func(ctx context.Context) (bool, error) {
		if _, err := client.CoreV1().Nodes().Get(ctx, c.nodeName, metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, nil
	}); err != nil {
		return err
	}

	info, _ := json.Marshal(readyInfo{
		Server:     server,
		Kubeconfig: c.kubeconfigOut,
		DataDir:    c.dataDir,
		Node:       c.nodeName,
		Pid:        os.Getpid(),
	})
	if _, err := fmt.Fprintf(readyOut, "%s%s\n", readyPrefix, info); err != nil {
		return fmt.Errorf("writing the ready line: %w", err)
	}
	logf("ready at %s after %v", server, time.Since(started).Round(time.Millisecond))

	select {
	case <-ctx.Done():
		logf("shutting down")
		return nil
	case err := <-apiDone:
		apiDone = closedWith(err)
		return fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-kcmDone:
		kcmDone = closedWith(err)
		return fmt.Errorf("kube-controller-manager stopped: %v", err)
	case err := <-kubeletDone:
		return fmt.Errorf("the kubelet stopped: %v", err)
	case err := <-etcd.Err():
		return fmt.Errorf("etcd failed: %v", err)
	}
}

// waitFor polls cond every 100ms until it is true, ctx ends, or the apiserver
// stops.
func waitFor(ctx context.Context, apiDone <-chan error, what string, cond func(context.Context) (bool, error)) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := cond(callCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case err := <-apiDone:
			return fmt.Errorf("waiting for %s: kube-apiserver stopped: %v", what, err)
		case <-t.C:
		}
	}
}

// closedWith returns a channel that yields err to the deferred shutdown code,
// which waits on the channel that the select already drained.
func closedWith(err error) <-chan error {
	ch := make(chan error, 1)
	ch <- err
	return ch
}

// writeKubeconfig writes an admin kubeconfig for server with the certificates
// embedded, so it stays valid wherever it is copied.
func writeKubeconfig(path, server string, p pki) error {
	ca, err := os.ReadFile(p.caCert())
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(p.adminCert())
	if err != nil {
		return err
	}
	key, err := os.ReadFile(p.adminKey())
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["localkube"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["localkube-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["localkube"] = &clientcmdapi.Context{Cluster: "localkube", AuthInfo: "localkube-admin", Namespace: "default"}
	cfg.CurrentContext = "localkube"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return writeFileAtomic(path, data, 0o600)
}
