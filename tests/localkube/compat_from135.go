//go:build !k8s134

package main

import (
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/featuregate"
)

// setMinCompatibilityVersion copies the feature gate's minimum compatibility
// version (new in 1.35) into the controller manager's effective version, as its
// in-process test server does.
func setMinCompatibilityVersion(v basecompatibility.MutableEffectiveVersion, gate featuregate.MutableVersionedFeatureGate) {
	v.SetMinCompatibilityVersion(gate.MinCompatibilityVersion())
}
