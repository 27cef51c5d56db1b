#!/usr/bin/env bash
# Builds container images without Docker and without any registry, into OCI image layouts under
# <repo>/target/images/, with umoci (Debian's `umoci` package: it writes OCI layouts directly, needs no daemon).
#
#   target/images/busybox/       an OCI layout holding two images that share one layer:
#     docker.io/windvane-test/busybox:local   the test workload image: Debian's busybox-static binary as
#                                              /bin/busybox with its applets as symlinks (/bin/sh, /bin/sleep,
#                                              ...); no entrypoint, `sh` as the command
#     docker.io/windvane-test/pause:local     the pod sandbox ("pause") image localkube --real-node configures in
#                                              containerd: the same layer, a shell that sleeps until SIGTERM
#   target/images/busybox.tar    that layout as one archive, what `ctr images import` reads
#
# Kubernetes names `windvane-test/busybox:local` expand to `docker.io/windvane-test/busybox:local`, the name
# stored here, so pods use the short name. The tag is not `latest`, so pods pull IfNotPresent by default: the
# node never tries a registry for them.
#
# Usage: deploy/images/build.sh        (prints how to load the images)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/target/images"
busybox_bin=/bin/busybox

for tool in umoci tar; do
	if ! command -v "$tool" >/dev/null; then
		echo "deploy/images/build.sh: $tool not found: apt-get install umoci tar (or run tests/prereqs.sh tests)" >&2
		exit 2
	fi
done
# busybox-static's binary, not a dynamically linked busybox: the image holds no shared libraries.
if [ ! -x "$busybox_bin" ] || ! "$busybox_bin" --list >/dev/null 2>&1 ||
	{ command -v ldd >/dev/null && ldd "$busybox_bin" 2>&1 | grep -q '=>'; }; then
	echo "deploy/images/build.sh: $busybox_bin is missing or not static: apt-get install busybox-static" >&2
	exit 2
fi

start=$(date +%s)
mkdir -p "$out"
work="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The root file system of the layer: the binary, its applets as relative symlinks, and the directories a
# shell in a container expects. Fixed modification times keep the layer's digest the same from one build to
# the next (umoci records them in the tar).
rootfs="$work/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc" "$rootfs/root"
chmod 1777 "$rootfs/tmp"
install -m 0755 "$busybox_bin" "$rootfs/bin/busybox"
for applet in $("$busybox_bin" --list); do
	[ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
find "$rootfs" -exec touch -h -d @0 {} +

layout="$work/busybox"
busybox_ref="docker.io/windvane-test/busybox:local"
pause_ref="docker.io/windvane-test/pause:local"
created="1970-01-01T00:00:00Z"
umoci init --layout "$layout"
umoci new --image "$layout:$busybox_ref"
umoci insert --image "$layout:$busybox_ref" --history.created "$created" --history.comment "busybox-static" \
	"$rootfs" /
umoci config --image "$layout:$busybox_ref" --history.created "$created" --created "$created" \
	--config.env PATH=/bin --config.cmd sh --config.workingdir /
# The sandbox: PID 1 of every pod, holding its namespaces. It must run until it is told to stop, and stop
# at once on SIGTERM (PID 1 ignores signals it has no handler for).
umoci config --image "$layout:$busybox_ref" --tag "$pause_ref" --history.created "$created" --created "$created" \
	--config.entrypoint /bin/sh --config.entrypoint -c \
	--config.entrypoint 'trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done' \
	--clear config.cmd
umoci gc --layout "$layout"

rm -rf "$out/busybox" "$out/busybox.tar"
mv "$layout" "$out/busybox"
tar -C "$out/busybox" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out/busybox.tar" .
echo "built $out/busybox ($busybox_ref, $pause_ref) and $out/busybox.tar in $(($(date +%s) - start))s" >&2
echo "load into a containerd: ctr --address SOCKET --namespace k8s.io images import $out/busybox.tar" >&2
echo "(localkube --real-node --load-image $out/busybox.tar does it for its node)" >&2
