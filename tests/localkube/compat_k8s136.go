//go:build k8s136

package main

// kubeMinor: built with go.1.36.mod and -tags k8s136 (build.sh --version 1.36).
// 1.36 builds with the same code as 1.37 (compat_from135.go, compat_from136.go).
const kubeMinor = "36"
