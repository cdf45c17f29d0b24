#!/usr/bin/env bash
# slurm_build.sh [--pyslurm] - Slurm 25.11 from source on this machine, through the collection's
# gpuhpc_slurm_build role (ansible-playbook on localhost): the archive from the source mirror
# ($GPUHPC_VENDOR_DIR, else ../shared/vendor beside the checkout; else a download that needs
# GPUHPC_SLURM_URL_SHA256), verified by its pinned sha256, built into a Debian package cached in
# ${GPUHPC_SLURM_BUILD_CACHE:-~/.cache/gpuhpc/slurm-build}/<key>/ and installed under
# /opt/gpuhpc/slurm-<version>. A second run builds nothing (the play reports changed=0).
#
# --pyslurm: also pyslurm (PyPI, built against that prefix) into <cache>/<key>/pyslurm-<version>/
# (a pip --target directory: put it on PYTHONPATH), not into the project's venv.
#
# The last line is `prefix=... pyslurm=...` (pyslurm empty without --pyslurm).
# Timings on 2 shared cores: the first build ~6-10 min, pyslurm ~4-5 min; cached: seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${GPUHPC_SLURM_VERSION:-25.11.7}
PYSLURM_VERSION=${GPUHPC_PYSLURM_VERSION:-25.11.2}
CACHE=${GPUHPC_SLURM_BUILD_CACHE:-$HOME/.cache/gpuhpc/slurm-build}
VENDOR=${GPUHPC_VENDOR_DIR:-}
if [ -z "$VENDOR" ] && [ -d ../shared/vendor ]; then VENDOR=$(cd ../shared/vendor && pwd); fi
ARCHIVE=${VENDOR:+$VENDOR/slurm-$VERSION.tar.gz}
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
mkdir -p "$CACHE"
play=$(mktemp "$CACHE/play-XXXXXX.yml")
trap 'rm -f "$play"' EXIT
cat > "$play" <<PLAY
- name: Slurm from source
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: gpuhpc.cluster.gpuhpc_slurm_build
PLAY
extra=$("$PY" -c 'import json, sys; print(json.dumps({
    "gpuhpc_slurm_build_version": sys.argv[1], "gpuhpc_slurm_build_archive": sys.argv[2],
    "gpuhpc_slurm_build_cache_dir": sys.argv[3], "gpuhpc_slurm_build_controller_cache": sys.argv[3] + "/debs",
    "gpuhpc_slurm_build_url_sha256": sys.argv[4], "ansible_python_interpreter": "/usr/bin/python3"}))' "$VERSION" "$ARCHIVE" "$CACHE" "${GPUHPC_SLURM_URL_SHA256:-}")
ANSIBLE_CONFIG=ansible/ansible.cfg ANSIBLE_COLLECTIONS_PATH="$PWD/ansible" \
  "$(dirname "$PY")/ansible-playbook" -i localhost, -e "$extra" "$play" | tee "$CACHE/last-play.log"
prefix=/opt/gpuhpc/slurm-$VERSION
[ -x "$prefix/sbin/slurmctld" ] || { echo "slurm_build: $prefix/sbin/slurmctld missing after the play" >&2; exit 1; }
pyslurm=""
if [ "${1:-}" = --pyslurm ]; then
  key=$(dpkg-query -W -f='${Version}' "gpuhpc-slurm-${VERSION%.*}" | sed 's/.*gpuhpc\.//')
  pyslurm="$CACHE/$key/pyslurm-$PYSLURM_VERSION"
  if [ ! -f "$pyslurm/.done" ]; then
    rm -rf "$pyslurm"
    echo "[slurm_build] pyslurm $PYSLURM_VERSION against $prefix (a few minutes)"
    SLURM_INCLUDE_DIR="$prefix/include" SLURM_LIB_DIR="$prefix/lib" \
      "$PY" -m pip install --quiet --no-cache-dir --target "$pyslurm" "pyslurm==$PYSLURM_VERSION"
    touch "$pyslurm/.done"
  fi
fi
echo "prefix=$prefix pyslurm=$pyslurm"
