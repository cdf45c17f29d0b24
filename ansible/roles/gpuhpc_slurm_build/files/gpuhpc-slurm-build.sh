#!/bin/bash
# Build Slurm from a verified source archive into a Debian package, once per
# (source digest, prefix, sysconfdir, configure flags): the result lives in
# CACHE/<key>/ and a second run with the same inputs only prints it.
#
#   gpuhpc-slurm-build.sh --archive A --sha256 S --version V [--prefix P]
#                         [--sysconfdir D] [--cache C] [--jobs N] [--install]
#
# The last line of stdout is `GPUHPC_SLURM_BUILD {json}` with changed true/false
# (Ansible's changed_when reads it). Exit 2 for a bad argument or a digest
# mismatch, 1 for a failed build (its log is named).
set -euo pipefail

archive= sha= version= prefix= sysconfdir=/etc/slurm cache="${HOME:-/root}/.cache/gpuhpc/slurm-build"
jobs="$(nproc)" install=0
die() { echo "gpuhpc-slurm-build: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --archive) archive="$2"; shift 2 ;;
    --sha256) sha="$2"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --prefix) prefix="$2"; shift 2 ;;
    --sysconfdir) sysconfdir="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --install) install=1; shift ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--version must look like 25.11.7, got '$version'"
[[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "--sha256 must be 64 lowercase hex digits"
[ -f "$archive" ] || die "--archive '$archive' is not a file"
prefix="${prefix:-/opt/gpuhpc/slurm-$version}"
[[ "$prefix" == /* && "$sysconfdir" == /* ]] || die "--prefix and --sysconfdir must be absolute paths"

got="$(sha256sum "$archive" | cut -d' ' -f1)"
[ "$got" = "$sha" ] || die "$archive has sha256 $got, pinned $sha: refusing it (fix the mirror or the pin)"

# Configure flags: what a GPU site needs, each where its build dependency is present.
flags=(--prefix="$prefix" --sysconfdir="$sysconfdir" --disable-debug --enable-pam
       --with-munge --with-json --with-jwt --with-http-parser --with-yaml --with-lz4
       --with-hwloc --with-lua --enable-cgroupv2 --disable-sview)
multiarch="$(gcc -print-multiarch 2>/dev/null || true)"
for p in "/usr/lib/$multiarch/pmix2" /usr/lib/pmix2 /usr; do
  if [ -f "$p/include/pmix.h" ]; then flags+=(--with-pmix="$p"); break; fi
done
for c in "${CUDA_HOME:-/usr/local/cuda}" /usr; do
  if [ -f "$c/include/nvml.h" ]; then flags+=(--with-nvml="$c"); break; fi
done

key="$(printf '%s\n' "$sha" "$version" "${flags[@]}" | sha256sum | cut -c1-16)"
dir="$cache/$key"
pkg="gpuhpc-slurm-${version%.*}"
debver="$version-1+gpuhpc.$key"
arch="$(dpkg --print-architecture)"
deb="$dir/${pkg}_${debver}_${arch}.deb"
mkdir -p "$cache"

result() {  # $1: changed (true/false)
  local installed=false
  if [ "$install" = 1 ]; then
    if [ "$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)" != "$debver" ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --allow-downgrades "$deb" >"$dir/install.log" 2>&1 \
        || { echo "gpuhpc-slurm-build: installing $deb failed, see $dir/install.log" >&2; exit 1; }
      installed=true
    fi
  fi
  printf 'GPUHPC_SLURM_BUILD {"changed": %s, "installed": %s, "key": "%s", "version": "%s", "prefix": "%s", "deb": "%s", "package": "%s", "package_version": "%s"}\n' \
    "$1" "$installed" "$key" "$version" "$prefix" "$deb" "$pkg" "$debver"
}

exec 9>"$cache/$key.lock"
flock 9
if [ -f "$dir/DONE" ]; then result false; exit 0; fi

log="$dir/build.log"
fail() { echo "gpuhpc-slurm-build: $1 failed, see $log" >&2; exit 1; }
if [ ! -f "$dir/.installed" ]; then     # else an earlier run got as far as the DESTDIR install
  rm -rf "$dir"; mkdir -p "$dir/src" "$dir/root"
  printf '%s\n' "${flags[@]}" > "$dir/configure-flags"
  t0=$(date +%s)
  tar -xf "$archive" -C "$dir/src" --strip-components=1
  cd "$dir/src"
  ./configure "${flags[@]}" >"$log" 2>&1 || fail configure
  t1=$(date +%s)
  make -j"$jobs" >>"$log" 2>&1 || fail make
  t2=$(date +%s)
  make install DESTDIR="$dir/root" >>"$log" 2>&1 || fail "make install"
  t3=$(date +%s)
  printf 'configure_s=%s make_s=%s install_s=%s\n' $((t1-t0)) $((t2-t1)) $((t3-t2)) > "$dir/times"
  touch "$dir/.installed"
fi
cd "$dir"

# Runtime dependencies: the Debian packages owning the libraries the ELF files load.
libs="$(find "$dir/root" -type f \( -name '*.so*' -o -perm -u+x \) -exec file -N {} + \
  | awk -F: '/ELF/{print $1}' \
  | xargs -r env LD_LIBRARY_PATH="$dir/root$prefix/lib:$dir/root$prefix/lib/slurm" ldd 2>/dev/null \
  | awk '/=> \//{print $3}' | sort -u || true)"
deps="$(for lib in $libs; do
          case "$lib" in "$dir"/*) continue ;; esac
          dpkg -S "$lib" 2>/dev/null || dpkg -S "$(realpath "$lib")" 2>/dev/null || true
        done | cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')"
mkdir -p "$dir/root/DEBIAN"
cat > "$dir/root/DEBIAN/control" <<CTL
Package: $pkg
Version: $debver
Architecture: $arch
Maintainer: gpuhpc <gpuhpc@localhost>
Section: admin
Priority: optional
Depends: $deps
Description: Slurm $version built by gpuhpc under $prefix
 Configure flags: $(tr '\n' ' ' < "$dir/configure-flags")
CTL
dpkg-deb --root-owner-group -Zgzip -z1 -b "$dir/root" "$deb" >>"$log" 2>&1 || fail dpkg-deb
rm -rf "$dir/src" "$dir/root"
touch "$dir/DONE"
result true
