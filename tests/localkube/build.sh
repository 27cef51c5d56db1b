#!/usr/bin/env bash
# Builds localkube (etcd + kube-apiserver + kube-controller-manager + fake
# node, and a matching kubectl as `localkube kubectl`) into
# <repo>/target/localkube/localkube, where the Rust test helper
# (tests/src/localkube.rs) looks for it.
#
# Needs only Go (the version in go.mod or newer) and the Go module proxy:
# modules are downloaded into the usual GOMODCACHE and compiled packages are
# kept in the usual GOCACHE, so a second build takes seconds.
#
# Usage: tests/localkube/build.sh [extra go build flags...]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/localkube/localkube"

mkdir -p "$(dirname "$out")"
cd "$here"

# -mod=readonly: go.mod and go.sum are committed and must not change here.
# -buildvcs=false: no git stamp, so a commit elsewhere does not force a relink
# (and a checkout without git still builds).
# -trimpath keeps absolute paths of this checkout out of the binary; it is
# part of the cache key, so repeated builds still hit the cache.
# -s -w drop the symbol table and DWARF debug info, for size.
# Building straight to "$out" (no temporary name) lets go skip the link when
# the binary there is already up to date.
start=$(date +%s)

# Stamp the Kubernetes version (as the upstream build does) so /version,
# `kubectl version` and the fake node report v1.X.Y, not v0.0.0-master. The
# stamp only depends on go.mod, so it does not defeat the link cache.
kube_version="$(go list -mod=readonly -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="${kube_version#v1.}"
minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean"
done

go build -mod=readonly -buildvcs=false -trimpath -ldflags="$ldflags" -o "$out" "$@" .
echo "built $out ($(du -h "$out" | cut -f1), $(( $(date +%s) - start ))s)" >&2
