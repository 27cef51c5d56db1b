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
#     registry.example.com/acme/api:1.4.2 and quay.io/prometheus/prometheus:v2.55.1
#                                              stand-ins for the example fleet's images (./demo --real-node):
#                                              the same layer, busybox httpd on the example's ports
#   target/images/busybox.tar    that layout as one archive, what `ctr images import` reads
#   target/images/windvane-agent/ and windvane-agent.tar (only with the argument `agent`):
#     docker.io/library/windvane-agent:local  the agent from the release binary (`cargo build --release
#                                              -p windvane-agent`), with deploy/agent/Dockerfile's layout:
#                                              /usr/local/bin/windvane-agent, user 65532:65532, entrypoint
#                                              the binary, command `run`, port 8481. Its base is what the
#                                              binary needs and nothing else, taken from this Debian machine:
#                                              the shared libraries `ldd` names (glibc, libgcc) and Debian's CA
#                                              certificates, as distroless "cc" has them; no shell.
#   target/images/windvane-server/ and windvane-server.tar (only with the argument `server`):
#     docker.io/library/windvane-server:local the server and the `windvane` command line, with
#                                              deploy/source-server/Dockerfile's layout: both in
#                                              /usr/local/bin, user 65532:65532, entrypoint windvane-server,
#                                              command `serve --listen=0.0.0.0:8080 --root=… --data=…`, port 8080;
#                                              the same base as the agent's.
#
# The binaries come from target/release (`cargo build --release --locked -p windvane-agent
# -p windvane-source-server -p windvane-cli`), or from the directory `--binaries DIR` names: the tests build
# their images from target/debug, which they build anyway (a release build would add minutes to CI).
#
# Kubernetes names `windvane-test/busybox:local` expand to `docker.io/windvane-test/busybox:local`, the name
# stored here, so pods use the short name. The tag is not `latest`, so pods pull IfNotPresent by default: the
# node never tries a registry for them.
#
# Usage: deploy/images/build.sh [--binaries DIR] [busybox] [agent] [server]
#        (default: busybox; prints how to load the images)
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
created="1970-01-01T00:00:00Z"

# publish NAME LAYOUT: moves a finished layout to target/images/NAME and archives it as NAME.tar.
publish() {
	rm -rf "${out:?}/$1" "$out/$1.tar"
	mv "$2" "$out/$1"
	tar -C "$out/$1" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out/$1.tar" .
	echo "built $out/$1 ($(jq -r '[.manifests[].annotations["org.opencontainers.image.ref.name"]] | join(", ")' \
		"$out/$1/index.json" 2>/dev/null || echo "see its index.json")) and $out/$1.tar" >&2
}

build_busybox() {
	# busybox-static's binary, not a dynamically linked busybox: the image holds no shared libraries.
	if [ ! -x "$busybox_bin" ] || ! "$busybox_bin" --list >/dev/null 2>&1 ||
		{ command -v ldd >/dev/null && ldd "$busybox_bin" 2>&1 | grep -q '=>'; }; then
		echo "deploy/images/build.sh: $busybox_bin is missing or not static: apt-get install busybox-static" >&2
		exit 2
	fi
	# The root file system of the layer: the binary, its applets as relative symlinks, and the directories a
	# shell in a container expects. Fixed modification times keep the layer's digest the same from one build to
	# the next (umoci records them in the tar).
	local rootfs="$work/rootfs" applet layout busybox_ref pause_ref
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
	# Stand-ins for the example fleet's two images (deploy/examples/fleet), for `./demo --real-node`: the same
	# layer, serving HTTP with busybox's httpd on the port the example's manifests name, and ignoring the
	# arguments those manifests pass (they become the shell's $0, $1, ...). Tagged with the example's names so
	# that its manifests run unchanged on a real node, which never pulls.
	umoci config --image "$layout:$busybox_ref" --tag "registry.example.com/acme/api:1.4.2" \
		--history.created "$created" --created "$created" \
		--config.entrypoint /bin/sh --config.entrypoint -c --config.entrypoint 'exec httpd -f -p 8080 -h /tmp' \
		--clear config.cmd
	umoci config --image "$layout:$busybox_ref" --tag "quay.io/prometheus/prometheus:v2.55.1" \
		--history.created "$created" --created "$created" \
		--config.entrypoint /bin/sh --config.entrypoint -c --config.entrypoint 'exec httpd -f -p 9090 -h /tmp' \
		--clear config.cmd
	umoci gc --layout "$layout"

	publish busybox "$layout"
}

# base_rootfs DIR BINARY...: a root file system with the binaries in /usr/local/bin, the shared libraries they
# load (with the paths `ldd` gives, so the dynamic loader finds them as on Debian), the CA certificates and the
# distroless "nonroot" user: what the Dockerfiles' distroless "cc" base holds that the binaries use.
base_rootfs() {
	local rootfs="$1" binary lib
	shift
	if [ ! -f /etc/ssl/certs/ca-certificates.crt ]; then
		echo "deploy/images/build.sh: /etc/ssl/certs/ca-certificates.crt not found: apt-get install ca-certificates" >&2
		exit 2
	fi
	mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/home/nonroot"
	chmod 1777 "$rootfs/tmp"
	chown 65532:65532 "$rootfs/home/nonroot"
	for binary in "$@"; do
		if [ ! -x "$binaries/$binary" ]; then
			echo "deploy/images/build.sh: $binaries/$binary not found: build it with cargo build --release --locked (or give --binaries DIR)" >&2
			exit 2
		fi
		install -m 0755 "$binaries/$binary" "$rootfs/usr/local/bin/$binary"
		for lib in $(ldd "$binaries/$binary" | grep -o '/[^ ]*'); do
			mkdir -p "$rootfs$(dirname "$lib")"
			cp -L "$lib" "$rootfs$lib"
		done
	done
	install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
		>"$rootfs/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
	find "$rootfs" -exec touch -h -d @0 {} +
}

# layered NAME ROOTFS CONFIG-ARGS...: the image docker.io/library/NAME:local from ROOTFS, as user 65532 with
# the given umoci config arguments, published as target/images/NAME.
layered() {
	local name="$1" rootfs="$2" layout="$work/$1" ref="docker.io/library/$1:local"
	shift 2
	umoci init --layout "$layout"
	umoci new --image "$layout:$ref"
	umoci insert --image "$layout:$ref" --history.created "$created" --history.comment "$name" "$rootfs" /
	umoci config --image "$layout:$ref" --history.created "$created" --created "$created" \
		--config.user 65532:65532 --config.workingdir /home/nonroot \
		--config.env PATH=/usr/local/bin:/usr/bin:/bin --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
		"$@"
	umoci gc --layout "$layout"
	publish "$name" "$layout"
}

# The agent, as deploy/agent/Dockerfile lays it out.
build_agent() {
	base_rootfs "$work/agent-rootfs" windvane-agent
	layered windvane-agent "$work/agent-rootfs" --config.entrypoint /usr/local/bin/windvane-agent \
		--config.cmd run --config.exposedports 8481/tcp
}

# The server and the command line, as deploy/source-server/Dockerfile lays them out.
build_server() {
	base_rootfs "$work/server-rootfs" windvane-server windvane
	layered windvane-server "$work/server-rootfs" --config.entrypoint /usr/local/bin/windvane-server \
		--config.cmd serve --config.cmd --listen=0.0.0.0:8080 --config.cmd --root=/var/lib/windvane/store \
		--config.cmd --data=/var/lib/windvane/data --config.exposedports 8080/tcp
}

binaries="$root/target/release"
if [ "${1:-}" = --binaries ]; then
	binaries="$(cd "${2:?--binaries needs a directory}" && pwd)"
	shift 2
fi
images=("$@")
[ "${#images[@]}" -gt 0 ] || images=(busybox)
start=$(date +%s)
mkdir -p "$out"
work="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
for image in "${images[@]}"; do
	case "$image" in
	busybox) build_busybox ;;
	agent) build_agent ;;
	server) build_server ;;
	*)
		echo "deploy/images/build.sh: unknown image $image (busybox, agent, server)" >&2
		exit 2
		;;
	esac
done
echo "built ${images[*]} in $(($(date +%s) - start))s; load into a containerd:" >&2
echo "  ctr --address SOCKET --namespace k8s.io images import $out/NAME.tar" >&2
echo "(localkube --real-node --load-image $out/NAME.tar does it for its node)" >&2
