//go:build k8s135

package main

// kubeMinor: built with go.1.35.mod and -tags k8s135 (build.sh --version 1.35).
// 1.35 needs 1.34's WatchListClient and klog shims (compat_upto135.go) and
// 1.37's minimum compatibility version (compat_from135.go).
const kubeMinor = "35"
