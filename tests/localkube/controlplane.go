package main

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/spf13/pflag"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/configz"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

const (
	serviceClusterIPRange = "10.0.0.0/16"
	serviceClusterFirstIP = "10.0.0.1"
)

// defaultControllers is what the controller manager runs unless --controllers
// says otherwise: everything on by default except controllers that need a
// kubelet, a cloud or volume plugins, which a test cluster without a node
// agent does not have (they would only burn CPU and log errors). The
// horizontal-pod-autoscaler controller stays on: with no metrics API it cannot
// compute a utilization, but it still enforces minReplicas and maxReplicas
// through the scale subresource, as on a real cluster — the real controller
// that tests of "the HPA owns replicas" need.
const defaultControllers = "*," +
	"-persistentvolume-attach-detach-controller," +
	"-persistentvolume-expander-controller," +
	"-node-ipam-controller," +
	"-selinux-warning-controller"

// startAPIServer runs kube-apiserver in this process, serving on ln, until ctx
// is cancelled; egressConfig is the egress guard's configuration. The returned channel receives Run's result once it returns.
// With profiling, the apiserver serves /debug/pprof/: one process, so its CPU
// profile covers etcd, the controllers and the fake node as well.
func startAPIServer(ctx context.Context, ln net.Listener, etcdURL string, p pki, egressConfig string, profiling bool) (<-chan error, error) {
	port := ln.Addr().(*net.TCPAddr).Port
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// The "kubernetes" Service cannot point at a loopback address.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + p.servingCert(),
		"--tls-private-key-file=" + p.servingKey(),
		"--client-ca-file=" + p.caCert(),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPub(),
		"--service-account-signing-key-file=" + p.saKey(),
		"--service-cluster-ip-range=" + serviceClusterIPRange,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=" + strconv.FormatBool(profiling),
		"--shutdown-delay-duration=0s",
		// Every connection into the cluster's network (webhooks, aggregated
		// APIs, the service proxy) goes through the loopback-only guard
		// (egress.go).
		"--egress-selector-config-file=" + egressConfig,
	}

	if err := beforeAPIServerFlags(); err != nil {
		return nil, fmt.Errorf("feature gates: %w", err)
	}
	s := apiserveroptions.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = ln
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	// The loopback clients of the apiserver should not log their own warnings.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})

	completed, err := s.Complete(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}

	done := make(chan error, 1)
	go func() {
		done <- apiserverapp.Run(ctx, completed)
	}()
	return done, nil
}

// startControllerManager runs kube-controller-manager in this process until
// ctx is cancelled, talking to the apiserver through kubeconfig.
func startControllerManager(ctx context.Context, kubeconfig string, controllers string, p pki) (<-chan error, error) {
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + controllers,
		"--leader-elect=false",
		// No HTTPS endpoint of its own: nothing scrapes it.
		"--secure-port=0",
		"--service-account-private-key-file=" + p.saKey(),
		"--root-ca-file=" + p.caCert(),
		"--use-service-account-credentials=false",
		"--cluster-signing-cert-file=" + p.caCert(),
		"--cluster-signing-key-file=" + p.caKey(),
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--profiling=false",
	}

	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	// kube-apiserver already owns the default component registry (its flags
	// closed the default feature gate); give the controller manager its own
	// copy, as its in-process test server does.
	featureGate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	effectiveVersion := utilcompatibility.DefaultBuildEffectiveVersion()
	effectiveVersion.SetEmulationVersion(featureGate.EmulationVersion())
	setMinCompatibilityVersion(effectiveVersion, featureGate)
	registry := basecompatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, effectiveVersion, featureGate); err != nil {
		return nil, err
	}
	s.ComponentGlobalsRegistry = registry

	all, disabled, aliases := kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases()
	named := s.Flags(all, disabled, aliases)
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	s.ParsedFlags = &named
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}

	c, err := s.Config(ctx, all, disabled, aliases)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager options: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer configz.Delete(kcmapp.ConfigzName)
		done <- kcmapp.Run(ctx, c.Complete())
	}()
	return done, nil
}
