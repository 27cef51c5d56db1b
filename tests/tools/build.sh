#!/usr/bin/env bash
# Builds the real rendering engines that `windvane publish` runs for Helm and kustomize apps, from their own
# Go modules (pinned in go.mod beside this script, as `tool` directives), into <repo>/target/tools/helm and
# <repo>/target/tools/kustomize; and the real `sops` (github.com/getsops/sops/v3) and `age-keygen`
# (filippo.io/age) that the secrets tests encrypt with, into <repo>/target/tools/sops and age-keygen; and SeaweedFS's
# `weed` (github.com/seaweedfs/seaweedfs), the S3-protocol server that the object-storage store tests publish to,
# into <repo>/target/tools/weed; the CNCF distribution registry (github.com/distribution/distribution/v3,
# cmd/registry), the OCI registry that the tests push charts to and `windvane build` pulls `oci://` charts
# from, into <repo>/target/tools/registry; and yaml2json (./yaml2json, on sigs.k8s.io/yaml as helm's go.mod pins it), the
# reference YAML reader the differential test compares Windvane's with, into <repo>/target/tools/yaml2json.
# sops, SeaweedFS and the registry have modules of their own (sops/go.mod, seaweedfs/go.mod, registry/go.mod):
# their cloud dependencies would otherwise move helm's pinned dependencies (and each other's). Nothing is
# re-implemented and no prebuilt binary is downloaded: Go fetches
# the modules from its module proxy into the usual GOMODCACHE and keeps compiled packages in the usual
# GOCACHE (shared with tests/localkube/build.sh: the k8s.io modules are at the same version, v0.37.2), so a
# second build takes seconds and a build with nothing changed is skipped outright.
#
# Usage: tests/tools/build.sh [--force]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/tools"
mkdir -p "$out"
cd "$here"

# Up to date when both binaries exist and were built from these very inputs (go.mod, go.sum, this script,
# the Go version): checking a stamp takes no time, where asking go to check its cache takes seconds.
stamp="$out/.inputs"
inputs="$(cat go.mod go.sum yaml2json/main.go sops/go.mod sops/go.sum seaweedfs/go.mod seaweedfs/go.sum \
	registry/go.mod registry/go.sum "$here/build.sh" |
	sha256sum | cut -d' ' -f1) $(go env GOVERSION)"
if [[ "${1:-}" != "--force" && -x "$out/helm" && -x "$out/kustomize" && -x "$out/sops" && -x "$out/age-keygen" &&
	-x "$out/weed" && -x "$out/registry" && -x "$out/yaml2json" && -f "$stamp" ]] &&
	[[ "$(cat "$stamp")" == "$inputs" ]]; then
	echo "target/tools/{helm,kustomize,sops,age-keygen,weed,registry,yaml2json} are up to date" >&2
	exit 0
fi
rm -f "$stamp"

start=$(date +%s)
version() { go list -mod=readonly -m -f '{{.Version}}' "$1"; }

# The same flags as localkube's build (see tests/localkube/build.sh): -mod=readonly keeps go.mod and go.sum
# as committed; -buildvcs=false and -trimpath keep this checkout out of the binary (and the cache key);
# -s -w drop symbols for size.
build() {
	local name="$1" package="$2" ldflags="$3"
	go build -mod=readonly -buildvcs=false -trimpath -ldflags="-s -w $ldflags" -o "$out/$name" "$package"
}

# Stamped as the upstream release builds are, so `helm version` and `kustomize version` tell the truth.
# Helm's default .Capabilities.KubeVersion comes from the client-go it is built with (v0.37.2: v1.37.0).
helm_version="$(version helm.sh/helm/v4)"
build helm helm.sh/helm/v4/cmd/helm \
	"-X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.metadata= \
-X helm.sh/helm/v4/internal/version.gitTreeState=clean"
kustomize_version="$(version sigs.k8s.io/kustomize/kustomize/v5)"
build kustomize sigs.k8s.io/kustomize/kustomize/v5 \
	"-X sigs.k8s.io/kustomize/api/provenance.version=kustomize/$kustomize_version"

# kubectl's and Helm's YAML reader, as a command (its version is sigs.k8s.io/yaml's in go.mod).
build yaml2json ./yaml2json ""

# sops stamps its version in its own version package (`sops --version` tells the truth); age-keygen prints none.
cd "$here/sops"
sops_version="$(version github.com/getsops/sops/v3)"
build sops github.com/getsops/sops/v3/cmd/sops "-X github.com/getsops/sops/v3/version.Version=${sops_version#v}"
build age-keygen filippo.io/age/cmd/age-keygen ""

# SeaweedFS stamps nothing in this form; `weed version` prints its own release number (4.53 at this commit).
cd "$here/seaweedfs"
weed_version="$(version github.com/seaweedfs/seaweedfs)"
build weed github.com/seaweedfs/seaweedfs/weed ""

# distribution stamps its version in its own version package (`registry --version` tells the truth).
cd "$here/registry"
registry_version="$(version github.com/distribution/distribution/v3)"
build registry github.com/distribution/distribution/v3/cmd/registry \
	"-X github.com/distribution/distribution/v3/version.version=$registry_version"

echo "$inputs" >"$stamp"
echo "built $out/helm ($helm_version), $out/kustomize ($kustomize_version), $out/sops ($sops_version)," \
	"$out/age-keygen, $out/weed ($weed_version), $out/registry ($registry_version) and $out/yaml2json" \
	"in $(($(date +%s) - start))s" >&2
