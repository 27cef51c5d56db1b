#!/usr/bin/env bash
# Builds what `localkube --real-node` needs beside localkube itself (which compiles the kubelet in, from the
# Kubernetes modules it already uses): containerd 2.x, its `ctr` client and its runc shim
# (containerd-shim-runc-v2), from containerd's own Go module, pinned in containerd/go.mod beside this script
# (as `tool` directives; Debian 12 ships only containerd 1.6, and Kubernetes 1.36+ needs 2.x's CRI), into
# <repo>/target/tools/{containerd,ctr,containerd-shim-runc-v2}. localkube looks for containerd there
# (--containerd). runc and the CNI plugins come from Debian (runc, containernetworking-plugins: see
# tests/prereqs.sh). Like tests/tools/build.sh: no prebuilt binary is downloaded; modules come from the Go
# module proxy into GOMODCACHE, compiled packages stay in GOCACHE, and a build with nothing changed is skipped.
#
# Usage: tests/tools/build-realnode.sh [--force]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/tools"
mkdir -p "$out"
cd "$here/containerd"

stamp="$out/.realnode-inputs"
inputs="$(cat go.mod go.sum "$here/build-realnode.sh" | sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
if [[ "${1:-}" != "--force" && -x "$out/containerd" && -x "$out/ctr" && -x "$out/containerd-shim-runc-v2" &&
	-f "$stamp" ]] && [[ "$(cat "$stamp")" == "$inputs" ]]; then
	echo "target/tools/{containerd,ctr,containerd-shim-runc-v2} are up to date" >&2
	exit 0
fi
rm -f "$stamp"

start=$(date +%s)
module=github.com/containerd/containerd/v2
version="$(go list -mod=readonly -m -f '{{.Version}}' "$module")"
# The same flags as the other Go tools (tests/tools/build.sh); stamped as containerd's release build does, so
# the node reports `containerd://2.x.y` as its runtime version. The shim is built static (no cgo), as upstream
# ships it: it outlives containerd and runs in every pod's mount namespace.
ldflags="-s -w -X $module/version.Version=$version -X $module/version.Revision= -X $module/version.Package=$module"
go build -mod=readonly -buildvcs=false -trimpath -ldflags="$ldflags" -o "$out/" \
	"$module/cmd/containerd" "$module/cmd/ctr"
CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath -ldflags="$ldflags" \
	-o "$out/containerd-shim-runc-v2" "$module/cmd/containerd-shim-runc-v2"

echo "$inputs" >"$stamp"
echo "built $out/containerd, ctr and containerd-shim-runc-v2 ($version) in $(($(date +%s) - start))s" >&2
