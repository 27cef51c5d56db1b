//go:build k8s134 || k8s135

package main

import (
	"io"

	"k8s.io/apimachinery/pkg/util/version"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientgofeaturegate "k8s.io/client-go/features"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
)

// beforeAPIServerFlags turns WatchListClient on in the process-wide feature
// gate before kube-apiserver's flags close it. kube-controller-manager 1.34
// does exactly that in its own Flags(), on the process-wide gate; in one
// process that gate is already closed by then and it would panic. Upstream the
// controller manager runs with it on, so the in-process one does too.
// kube-controller-manager 1.35 still has that override, but client-go 1.35
// turns WatchListClient on by default, so here it returns at once; 1.36
// dropped the override.
func beforeAPIServerFlags() error {
	name := featuregate.Feature(clientgofeaturegate.WatchListClient)
	if utilfeature.DefaultFeatureGate.Enabled(name) {
		return nil
	}
	return utilfeature.DefaultMutableFeatureGate.OverrideDefaultAtVersion(name, true, version.MustParse("1.34"))
}

// klogStderrSettings: klog v2.130 (1.34's and 1.35's) has no
// legacy_stderr_threshold_behavior and ignores stderrthreshold under
// logtostderr, so log "to files" instead, discard the files' copy, and let
// stderrthreshold pick what reaches stderr.
func klogStderrSettings() map[string]string {
	klog.SetOutput(io.Discard)
	return map[string]string{"logtostderr": "false", "alsologtostderr": "false"}
}
