//go:build !k8s134 && !k8s135 && !k8s136

package main

// kubeMinor is the Kubernetes minor these sources are built against with
// go.mod (the newest supported, no tag). main checks it against the version
// stamp so a binary built with the wrong module file or tag fails at start
// instead of testing the wrong release.
//
// Each minor has a module file (go.1.3X.mod, go.mod for the newest) and a tag
// (k8s134, k8s135, k8s136, none for 1.37), chosen by build.sh --version. What
// differs between the minors' in-process APIs is in files named for the
// minors they cover:
//
//	shim (file)                                       1.34  1.35  1.36  1.37
//	WatchListClient on before apiserver flags (upto135) yes   yes   -     -
//	klog stderr settings, klog v2.130 (upto135)         yes   yes   -     -
//	klog stderr settings, klog v2.140 (from136)         -     -     yes   yes
//	minimum compatibility version (from135; k8s134)     none  copy  copy  copy
const kubeMinor = "37"
