//go:build !k8s134

package main

import (
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
)

// kubeMinor is the Kubernetes minor these sources are built against with
// go.mod (the newest supported); compat_k8s134.go is the oldest. main checks
// it against the version stamp so a binary built with the wrong module file
// or tag fails at start instead of testing the wrong release.
const kubeMinor = "37"

// beforeAPIServerFlags runs before kube-apiserver's flags close the
// process-wide feature gate. Nothing is needed on this release.
func beforeAPIServerFlags() error { return nil }

// klogStderrSettings are the klog flags that send logs to stderr only and
// honour stderrthreshold although everything goes to stderr.
func klogStderrSettings() map[string]string {
	return map[string]string{"logtostderr": "true", "legacy_stderr_threshold_behavior": "false"}
}

// setMinCompatibilityVersion copies the feature gate's minimum compatibility
// version into the controller manager's effective version, as its in-process
// test server does.
func setMinCompatibilityVersion(v basecompatibility.MutableEffectiveVersion, gate featuregate.MutableVersionedFeatureGate) {
	v.SetMinCompatibilityVersion(gate.MinCompatibilityVersion())
}
