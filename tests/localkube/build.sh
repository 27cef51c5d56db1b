#!/usr/bin/env bash
# Builds localkube (etcd + kube-apiserver + kube-controller-manager + fake
# node, and a matching kubectl as `localkube kubectl`) into
# <repo>/target/localkube/localkube, where the Rust test helper
# (tests/src/localkube.rs) looks for it.
#
# --version 1.37 (the default, the newest Kubernetes minor Windvane supports)
# builds from go.mod; --version 1.34 (the oldest), 1.35 or 1.36 builds from
# go.1.3X.mod with the k8s13X build tag into target/localkube/1.3X/localkube.
# The Go sources are shared; only the module file and that tag differ (the
# shims each minor needs are listed in compat_k8s137.go). All minors share
# Go's module and build caches.
#
# Needs only Go (the version in go.mod or newer) and the Go module proxy:
# modules are downloaded into the usual GOMODCACHE and compiled packages are
# kept in the usual GOCACHE, so a second build takes seconds.
#
# Usage: tests/localkube/build.sh [--version 1.34|1.35|1.36|1.37] [extra go build flags...]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

version=1.37
if [ "${1:-}" = "--version" ]; then
	version="${2:?--version needs 1.34, 1.35, 1.36 or 1.37}"
	shift 2
fi
case "$version" in
1.37)
	out="$root/target/localkube/localkube"
	modflags=(-mod=readonly)
	;;
1.34 | 1.35 | 1.36)
	out="$root/target/localkube/$version/localkube"
	modflags=(-mod=readonly -modfile="go.$version.mod" -tags="k8s1${version#1.}")
	;;
*)
	echo "build.sh: unsupported --version $version (supported: 1.34, 1.35, 1.36, 1.37)" >&2
	exit 2
	;;
esac

mkdir -p "$(dirname "$out")"
cd "$here"

# -mod=readonly: go.mod and go.sum (go.1.3X.*) are committed and must not change here.
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
kube_version="$(go list "${modflags[@]}" -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="${kube_version#v1.}"
minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean"
done

go build "${modflags[@]}" -buildvcs=false -trimpath -ldflags="$ldflags" -o "$out" "$@" .
echo "built $out ($(du -h "$out" | cut -f1), $(( $(date +%s) - start ))s)" >&2
