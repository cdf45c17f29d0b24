#!/usr/bin/env bash
# Build enroot and pyxis (docs/containers.md) from their source archives and install them into a
# prefix. Neither is packaged by Debian 12. The gpuhpc_containers role copies this script to each
# host and runs it; scripts/build-containers.sh runs it here.
#
#   scripts/build-containers.sh [--prefix DIR] [--sysconfdir DIR] [--no-setcap] [--force]
#   scripts/build-containers.sh --packages   # print PACKAGES (a host without a route out needs
#                                            # them in its apt cache: scripts/lab.sh bakes them in)
#
# Sources: $GPUHPC_VENDOR_DIR, a local mirror holding enroot-4.1.2.tar.gz and pyxis-0.24.0.tar.gz
# (`git archive` of the release tags; their sha256 is pinned below), for hosts that reach no
# source host. Without one (or an archive missing there) the release tag's archive is
# downloaded from GitHub. Either way the unpacked tree must match the pinned tree digest (the
# sha256 of its files' sha256sum list and its symlinks), which does not depend on how the
# archive was compressed; a mirror's archive must match its pinned sha256 as well.
#
# Build (checked on Debian 12 / Slurm 22.05, and on Debian 13 / 24.11 in the lab): enroot's git
# submodules (makeself, musl, libbsd, linux-headers) are not in the archives; Debian's makeself,
# linux-libc-dev and libbsd-dev replace them (FORCE_GLIBC=1; glibc 2.36 has no strlcpy: libbsd's
# string.h and libbsd.so; libc6-dev named: trixie's gcc only recommends it);
# pyxis builds against Debian's libslurm-dev unchanged. As root, `make setcap` gives enroot's
# helpers the capabilities image import needs as an ordinary user (--no-setcap: not).
# Missing packages (PACKAGES: the build's and enroot's run-time tools) are installed with apt-get
# when run as root.
#
# Installs: PREFIX/bin/enroot*, PREFIX/lib/enroot, SYSCONFDIR/enroot (default PREFIX/etc),
# PREFIX/share/enroot, PREFIX/lib/slurm/spank_pyxis.so, PREFIX/share/pyxis/pyxis.conf (the
# plugstack.conf line), and PREFIX/share/gpuhpc/containers.stamp: the versions, the sources' tree
# digests and the installed Slurm's version. A second run with the same stamp does nothing
# (--force: rebuild); a Slurm upgrade or new sources rebuild.
set -euo pipefail

ENROOT_VERSION=4.1.2
PYXIS_VERSION=0.24.0
# name  version  archive sha256 (the mirror's git archive)  tree digest  release URL
SOURCES=(
  "enroot $ENROOT_VERSION 817e8d551135e6f3fc311d1ee57b03fb4d30325acba732f8dea43069ca11f8d3 417e3fd63b9de725e09f7eaab2200f67992a6ab77b31a372583324019137b06f https://github.com/NVIDIA/enroot/archive/refs/tags/v$ENROOT_VERSION.tar.gz"
  "pyxis $PYXIS_VERSION 063653ba39125ac29796cc6079701d1ec34dd4c5baf698efacc0f36bf3619681 462f8425fbbad073a8d2242885fe55ee19d2fe618266edbd091eb3babc854152 https://github.com/NVIDIA/pyxis/archive/refs/tags/v$PYXIS_VERSION.tar.gz"
)
PACKAGES=(make gcc libc6-dev makeself linux-libc-dev libbsd-dev libslurm-dev libcap2-bin curl ca-certificates
          jq squashfs-tools parallel zstd pigz)   # the last line: what enroot runs (image import)

prefix=/usr/local sysconfdir= setcap=auto force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --sysconfdir) sysconfdir=$2; shift 2 ;;
    --no-setcap) setcap=0; shift ;;
    --force) force=1; shift ;;
    --packages) echo "${PACKAGES[*]}"; exit 0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-containers: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) echo "build-containers: --prefix must be an absolute path" >&2; exit 2 ;; esac
sysconfdir=${sysconfdir:-$prefix/etc}
[ "$setcap" = auto ] && { [ "$(id -u)" = 0 ] && setcap=1 || setcap=0; }

log() { printf 'build-containers: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

installed_version() {  # a Debian package's version if it is installed, else nothing (and status 0)
  { dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null || true; } | sed -n 's/^.i. *//p'
}
# The Slurm pyxis is built for: the installed Slurm packages' version. pyxis is compiled against
# libslurm-dev's headers and slurmstepd refuses a plugin of another release, so a Slurm upgrade
# must rebuild it: the version is in the stamp, and libslurm-dev is held at the same version below.
slurm_version=none
for p in slurmd slurm-client slurmctld; do
  v=$(installed_version "$p")
  if [ -n "$v" ]; then slurm_version=$v; break; fi
done
# what is installed is identified by the sources' pinned tree digests, not only their versions
trees=""
for entry in "${SOURCES[@]}"; do read -r name _ _ tree _ <<<"$entry"; trees="$trees $name:$tree"; done
stamp="$prefix/share/gpuhpc/containers.stamp"
want="enroot $ENROOT_VERSION pyxis $PYXIS_VERSION trees$trees slurm $slurm_version sysconfdir $sysconfdir setcap $setcap"
if [ "$force" = 0 ] && [ -r "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && [ -x "$prefix/bin/enroot" ] && [ -e "$prefix/lib/slurm/spank_pyxis.so" ]; then
  log "enroot $ENROOT_VERSION and pyxis $PYXIS_VERSION are already in $prefix"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/gpuhpc-build-containers.XXXXXX")
trap 'rm -rf -- "$work"' EXIT

tree_digest() {  # the sha256 of a tree's files' sha256sum list and its symlinks' targets
  (cd "$1" && { find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
                find . -type l -printf '%p -> %l\n' | LC_ALL=C sort; } | sha256sum | cut -d' ' -f1)
}

# ---------------------------------------------------------------- sources, checked
for entry in "${SOURCES[@]}"; do
  read -r name version sum tree url <<<"$entry"
  archive="$name-$version.tar.gz"
  if [ -n "${GPUHPC_VENDOR_DIR:-}" ] && [ -f "$GPUHPC_VENDOR_DIR/$archive" ]; then
    got=$(sha256sum "$GPUHPC_VENDOR_DIR/$archive" | cut -d' ' -f1)
    [ "$got" = "$sum" ] || die "$GPUHPC_VENDOR_DIR/$archive: sha256 $got, expected $sum (pinned in $0)"
    cp -- "$GPUHPC_VENDOR_DIR/$archive" "$work/$archive"
    log "$archive from the mirror $GPUHPC_VENDOR_DIR (sha256 checked)"
  else
    log "${GPUHPC_VENDOR_DIR:+no $archive in $GPUHPC_VENDOR_DIR: }downloading $url"
    curl -fsSL --retry 3 -o "$work/$archive" "$url" || die "cannot download $url (set GPUHPC_VENDOR_DIR to a mirror)"
  fi
  mkdir -p "$work/$name"
  tar -xzf "$work/$archive" -C "$work/$name" --strip-components=1 --no-same-owner
  got=$(tree_digest "$work/$name")
  [ "$got" = "$tree" ] || die "$archive: tree digest $got, expected $tree (pinned in $0): not $name $version"
done

# ---------------------------------------------------------------- build packages
missing=()
for p in "${PACKAGES[@]}"; do
  have=$(installed_version "$p")
  if [ "$p" = libslurm-dev ] && [ "$slurm_version" != none ]; then
    [ "$have" = "$slurm_version" ] || missing+=("libslurm-dev=$slurm_version")   # the headers of the Slurm installed
  else
    [ -n "$have" ] || missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing build packages: ${missing[*]} (apt-get install them as root)"
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# ---------------------------------------------------------------- enroot
cd "$work/enroot"
# the submodules' stand-ins: Debian's makeself, glibc + libbsd (FORCE_GLIBC), linux-libc-dev
install -m 755 -D "$(command -v makeself)" deps/dist/makeself/bin/enroot-makeself
printf 'all:\n\t@:\nclean:\n\t@:\n' > deps/Makefile
enroot_make=(make -o deps FORCE_GLIBC=1 prefix="$prefix" sysconfdir="$sysconfdir")
CFLAGS="-D_GNU_SOURCE= -include bsd/string.h" LOADLIBES="-l:libbsd.so" \
  "${enroot_make[@]}" -j"$(nproc)" all >"$work/enroot.log" 2>&1 || { tail -n 30 "$work/enroot.log" >&2; die "enroot build failed"; }
"${enroot_make[@]}" install >>"$work/enroot.log" 2>&1 || { tail -n 30 "$work/enroot.log" >&2; die "enroot install failed"; }
if [ "$setcap" = 1 ]; then
  "${enroot_make[@]}" setcap >>"$work/enroot.log" 2>&1 || { tail -n 5 "$work/enroot.log" >&2; die "make setcap failed (a file system without xattrs? --no-setcap)"; }
fi
log "enroot $ENROOT_VERSION installed in $prefix (config $sysconfdir/enroot; setcap: $([ "$setcap" = 1 ] && echo done || echo skipped))"

# ---------------------------------------------------------------- pyxis
cd "$work/pyxis"
make -j"$(nproc)" prefix="$prefix" all >"$work/pyxis.log" 2>&1 || { tail -n 30 "$work/pyxis.log" >&2; die "pyxis build failed"; }
make prefix="$prefix" install >>"$work/pyxis.log" 2>&1 || { tail -n 30 "$work/pyxis.log" >&2; die "pyxis install failed"; }
log "pyxis $PYXIS_VERSION installed: $prefix/lib/slurm/spank_pyxis.so (plugstack line in $prefix/share/pyxis/pyxis.conf)"

mkdir -p "${stamp%/*}"
printf '%s\n' "$want" > "$stamp"
