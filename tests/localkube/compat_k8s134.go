//go:build k8s134

package main

import (
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
)

// kubeMinor: built with go.1.34.mod and -tags k8s134 (build.sh --version 1.34),
// the oldest Kubernetes minor Windvane supports. What each minor needs is
// listed in compat_k8s137.go.
const kubeMinor = "34"

// setMinCompatibilityVersion: a 1.34 feature gate has no minimum compatibility
// version (it came in 1.35); the effective version keeps its default.
func setMinCompatibilityVersion(basecompatibility.MutableEffectiveVersion, featuregate.MutableVersionedFeatureGate) {
}
