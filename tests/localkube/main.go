// Command localkube runs a small but real Kubernetes control plane in one
// process, for Windvane's integration tests:
//
//   - an embedded etcd (go.etcd.io/etcd/server/v3/embed),
//   - kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app) with RBAC,
//   - kube-controller-manager (k8s.io/kubernetes/cmd/kube-controller-manager/app),
//   - a fake node that binds pods to itself and reports them Running and Ready
//     (there is no kubelet and no container runtime: nothing is executed).
//
// It writes an admin kubeconfig (client certificate in system:masters) and,
// once the control plane is usable, prints exactly one line on stdout:
//
//	LOCALKUBE_READY {"server":"https://127.0.0.1:PORT","kubeconfig":"/path",...}
//
// Everything else goes to stderr. SIGTERM or SIGINT shut it down cleanly
// (exit 0). Starting it again on the same --data-dir reuses the certificates
// and the etcd data.
//
// The binary is multi-call: `localkube kubectl ARGS...` (or the binary invoked
// under the name `kubectl`) runs the kubectl of the same Kubernetes release.
package main

import (
	"os"
	"path/filepath"
	"strings"
)

func main() {
	if strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe") == "kubectl" {
		runKubectl(os.Args[1:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "kubectl" {
		runKubectl(os.Args[2:])
		return
	}
	os.Exit(runLocalkube(os.Args[1:]))
}
