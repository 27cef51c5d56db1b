#!/usr/bin/env bash
# What each of the project's commands needs on the machine, in one list, checked before anything is built.
#
#   tests/prereqs.sh tests    # what `tests/run` needs (called by it)
#   tests/prereqs.sh demo     # what `./demo` needs (called by it)
#   tests/prereqs.sh --check tests|demo   # only report; never install
#
# On Debian as root, missing distribution packages are installed with apt-get (WINDVANE_NO_INSTALL=1, or
# --check, turns that off). Anywhere else it prints every missing piece with the exact install line and
# exits 1 at once. The toolchains (Rust, Go) are never installed here: it says which version to get.
set -euo pipefail
# Only shell builtins and a few core tools (sed, sort, head, cut, id) are used: this runs on bare machines.
here="${BASH_SOURCE[0]%/*}"
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
root="$(cd "$here/.." && pwd)"

usage() { echo "usage: tests/prereqs.sh [--check] tests|demo" >&2; exit 2; }
check_only=0
if [ "${1:-}" = --check ]; then check_only=1; shift; fi
[ "$#" -eq 1 ] || usage
purpose="$1"
case "$purpose" in tests | demo) ;; *) usage ;; esac

# The one list: `purposes|what it is for|how to find it|Debian package`. A check is a command name on
# PATH, or an absolute path pattern (a glob) for programs Debian keeps off PATH.
requirements=(
  "tests demo|C compiler and linker (ring, SQLite)|cc|build-essential"
  "tests|key interoperability tests|openssl|openssl"
  "tests|the server's PostgreSQL tests|/usr/lib/postgresql/*/bin/initdb|postgresql"
  "tests|the fleet page test in a real browser|chromium|chromium"
  "tests|the pointer benchmark's baseline|/usr/sbin/nginx|nginx-light"
  "tests|the pointer benchmark's load generator|wrk|wrk"
  "tests|the load balancer in front of the server replicas test|/usr/sbin/haproxy|haproxy"
  "tests|the loopback-only network namespace the tests run in (tests/loopback-only)|unshare|util-linux"
  "tests|bringing loopback up in that namespace|ip|iproute2"
  "tests|the real node's container runtime (localkube --real-node)|/usr/sbin/runc|runc"
  "tests|the real node's pod network (CNI bridge, host-local, loopback, portmap)|/usr/lib/cni/bridge|containernetworking-plugins"
  "tests|the test workload image (deploy/images/build.sh)|/bin/busybox|busybox-static"
  "tests|building OCI images without Docker (deploy/images/build.sh)|umoci|umoci"
)

found() {
  local check="$1"
  if [[ "$check" == /* ]]; then
    compgen -G "$check" >/dev/null
  else
    command -v "$check" >/dev/null 2>&1
  fi
}

# Prints why the toolchains fall short, one line each; nothing when they are fine.
toolchain_gaps() {
  local want have
  want="$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$root/tests/localkube/go.mod")"
  if ! command -v go >/dev/null 2>&1; then
    echo "Go $want or newer (builds tests/localkube): not found on PATH; install the official Go release (Debian 12's golang-go is older)"
  else
    have="$(go env GOVERSION 2>/dev/null | sed 's/^go//')"
    if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
      echo "Go $want or newer (builds tests/localkube): found go$have; install a newer Go release"
    fi
  fi
  want="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$root/Cargo.toml")"
  if ! command -v cargo >/dev/null 2>&1; then
    echo "Rust $want or newer: cargo not found on PATH; install it with rustup"
  else
    have="$(cargo --version | cut -d' ' -f2)"
    if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
      echo "Rust $want or newer: found cargo $have; run 'rustup update'"
    fi
  fi
}

missing_packages=()
missing_lines=()
for requirement in "${requirements[@]}"; do
  IFS='|' read -r purposes why check package <<<"$requirement"
  [[ " $purposes " == *" $purpose "* ]] || continue
  found "$check" && continue
  missing_packages+=("$package")
  missing_lines+=("  - ${check##*/} ($why): Debian package $package")
done
mapfile -t toolchains < <(toolchain_gaps)

can_install() {
  [ "$check_only" = 0 ] && [ -z "${WINDVANE_NO_INSTALL:-}" ] && [ "$(id -u)" = 0 ] &&
    [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1
}

if [ "${#missing_packages[@]}" -gt 0 ] && can_install; then
  echo "installing what '$purpose' needs: ${missing_packages[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" >/dev/null
  missing_packages=()
  missing_lines=()
fi

if [ "${#missing_packages[@]}" -eq 0 ] && [ "${#toolchains[@]}" -eq 0 ]; then
  exit 0
fi
{
  echo "'$purpose' needs what this machine lacks:"
  for line in "${toolchains[@]}"; do echo "  - $line"; done
  for line in "${missing_lines[@]}"; do echo "$line"; done
  if [ "${#missing_packages[@]}" -gt 0 ]; then
    echo "Install the packages with:"
    echo "  sudo apt-get install --no-install-recommends ${missing_packages[*]}"
    echo "(other distributions: the same programs from their own packages; run as root on Debian and this is done for you)"
  fi
} >&2
exit 1
