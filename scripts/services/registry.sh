#!/usr/bin/env bash
# registry.sh start|stop|wipe|packages|image - a local container registry for the container tests and the
# quickstart (docs/containers.md), run directly (no systemd): Debian's docker-registry on
# 127.0.0.1:$PORT (default 5500: below Linux's ephemeral ports, 32768-60999, so no outgoing
# connection holds it), data under $D (default /var/tmp/gpuhpc-registry). ADDR: the address it
# listens on and is named by (default 127.0.0.1; the lab's runs on its switch: scripts/lab.sh registry).
# `start` also builds a tiny image, gpuhpc/test:1 (a busybox root filesystem with an
# /etc/os-release of its own, made with umoci) and pushes it with `skopeo copy --format v2s2`
# (enroot gets 404 for an OCI manifest), once, with an NGC-style twin, gpuhpc/test:ngc (the same
# files; its config sets NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=compute,utility
# as NVIDIA's images do). `start` and `image [TAG]` print, alone on the last line, the image
# (default tag 1) pinned by the digest the registry reports:
#   export GPUHPC_TEST_IMAGE=$(scripts/services/registry.sh start | tail -1)
#   -> 127.0.0.1:5500#gpuhpc/test@sha256:...
# Plain HTTP on the loopback: enroot needs ENROOT_ALLOW_HTTP=yes for it.
# Debian packages: docker-registry umoci skopeo busybox-static (installed when missing, as root).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${D:-/var/tmp/gpuhpc-registry}; PORT=${PORT:-5500}; ADDR=${ADDR:-127.0.0.1}
PACKAGES=(docker-registry umoci skopeo busybox-static)
. scripts/services/lib.sh
private_dir "$D" 755
REPO=gpuhpc/test TAG=1 TAGS=(1 ngc)
alive() { [ -s "$D/registry.pid" ] && kill -0 "$(cat "$D/registry.pid")" 2>/dev/null; }
up() { (exec 3<>"/dev/tcp/$ADDR/$PORT" && printf 'GET /v2/ HTTP/1.0\r\n\r\n' >&3 && head -n 1 <&3 | grep -q ' 200 ') 2>/dev/null; }
pinned() {
  local digest tag=${1:-$TAG}
  case " ${TAGS[*]} " in *" $tag "*) ;; *) echo "registry.sh: no tag $tag (one of: ${TAGS[*]})" >&2; exit 2 ;; esac
  digest=$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$ADDR:$PORT/$REPO:$tag")
  echo "$ADDR:$PORT#$REPO@$digest"
}
build_and_push() {
  local oci="$D/oci" bundle="$D/bundle" rootfs
  rm -rf -- "$oci" "$bundle"
  umoci init --layout "$oci"
  umoci new --image "$oci:test"
  umoci unpack --image "$oci:test" "$bundle" >/dev/null
  rootfs=$bundle/rootfs
  mkdir -p "$rootfs"/{bin,etc,tmp,root,proc,sys,dev,home}
  install -m 755 "$(command -v busybox)" "$rootfs/bin/busybox"
  for tool in sh cat ls id echo true false sleep env touch mkdir rm stat printf test head grep hostname; do
    ln -sf busybox "$rootfs/bin/$tool"
  done
  printf 'NAME="gpuhpc test image"\nID=gpuhpc-test\nVERSION_ID=1\nPRETTY_NAME="gpuhpc test image 1 (busybox)"\n' \
    > "$rootfs/etc/os-release"
  printf 'root:x:0:0:root:/root:/bin/sh\n' > "$rootfs/etc/passwd"
  printf 'root:x:0:\n' > "$rootfs/etc/group"
  umoci repack --image "$oci:test" "$bundle" >/dev/null
  umoci config --image "$oci:test" --config.cmd /bin/sh --config.env PATH=/bin
  umoci config --image "$oci:test" --tag ngc --config.env NVIDIA_VISIBLE_DEVICES=all \
    --config.env NVIDIA_DRIVER_CAPABILITIES=compute,utility
  skopeo copy --quiet --format v2s2 --dest-tls-verify=false "oci:$oci:test" "docker://$ADDR:$PORT/$REPO:1"
  skopeo copy --quiet --format v2s2 --dest-tls-verify=false "oci:$oci:ngc" "docker://$ADDR:$PORT/$REPO:ngc"
  rm -rf -- "$oci" "$bundle"
}
install_packages() {
  local p missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "registry.sh: missing packages: ${missing[*]}" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" >&2
  fi
}
case "${1:-start}" in
packages) install_packages ;;   # only that (the lab's registry: before it starts in a namespace with no route out)
start)
  install_packages
  # a registry running on another port (an older default), or not answering (the lab's, left in the
  # network namespace of a lab since taken down): restarted on $ADDR:$PORT, its data kept
  if alive && { ! grep -qx "  addr: $ADDR:$PORT" "$D/config.yml" 2>/dev/null || ! up; }; then
    kill "$(cat "$D/registry.pid")"
    for _ in $(seq 1 50); do alive || break; sleep 0.1; done
    rm -f "$D/registry.pid"
  fi
  if ! alive; then
    if (echo > "/dev/tcp/$ADDR/$PORT") 2>/dev/null; then echo "registry.sh: port $PORT already in use" >&2; exit 1; fi
    mkdir -p "$D/data"
    cat > "$D/config.yml" <<EOC
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $D/data}
  delete: {enabled: true}
http:
  addr: $ADDR:$PORT
EOC
    setsid docker-registry serve "$D/config.yml" > "$D/registry.log" 2>&1 < /dev/null &
    echo $! > "$D/registry.pid"
    for _ in $(seq 1 100); do up && break; alive || break; sleep 0.1; done
    up || { echo "registry.sh: the registry did not start (log: $D/registry.log)" >&2; tail -n 5 "$D/registry.log" >&2; exit 1; }
  fi
  for tag in "${TAGS[@]}"; do
    skopeo inspect --tls-verify=false --raw "docker://$ADDR:$PORT/$REPO:$tag" >/dev/null 2>&1 || { build_and_push; break; }
  done
  pinned
  ;;
image) pinned "${2:-}" ;;
stop)
  if alive; then kill "$(cat "$D/registry.pid")"; fi
  rm -f "$D/registry.pid"
  ;;
wipe) "$0" stop; rm -rf -- "$D/data" "$D/config.yml" "$D/registry.log" ;;
*) echo "usage: registry.sh start|stop|wipe|packages|image [TAG]" >&2; exit 2 ;;
esac
