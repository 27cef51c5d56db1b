//go:build !k8s134 && !k8s135

package main

// beforeAPIServerFlags runs before kube-apiserver's flags close the
// process-wide feature gate. Nothing is needed from 1.36 on: the controller
// manager no longer turns WatchListClient on in its Flags() (1.36 made it the
// client-go default).
func beforeAPIServerFlags() error { return nil }

// klogStderrSettings are the klog flags that send logs to stderr only and
// honour stderrthreshold although everything goes to stderr (klog v2.140,
// which 1.36 and 1.37 require).
func klogStderrSettings() map[string]string {
	return map[string]string{"logtostderr": "true", "legacy_stderr_threshold_behavior": "false"}
}
