#!/usr/bin/env bash
# wheelhouse.sh OUT PYTHON_VERSION [CACHE] - an offline wheelhouse for the gpuhpc_login role
# (gpuhpc_login_wheelhouse): gpuhpc's own wheel, built from this checkout, and every wheel
# 'gpuhpc[postgres]' needs under the collection's constraints (constraints.txt), for CPython
# PYTHON_VERSION (e.g. 3.13: the hosts' /usr/bin/python3) on x86_64 glibc >= 2.34 (Debian 12 and
# 13), downloaded here, where PyPI is reachable, for hosts that have no index:
#   scripts/wheelhouse.sh /shared/wheelhouse 3.13
#   ansible-playbook -i INVENTORY gpuhpc.cluster.login -e gpuhpc_login_wheelhouse=/shared/wheelhouse
# CACHE: a directory that keeps the dependencies' wheels under a key of the constraints, the
# package's metadata and the target, so they are downloaded once (gpuhpc's own wheel is built
# every time: it is the code of this checkout). OUT is replaced.
set -euo pipefail
OUT=${1:?usage: wheelhouse.sh OUT PYTHON_VERSION [CACHE]}; PYV=${2:?usage: wheelhouse.sh OUT PYTHON_VERSION [CACHE]}
CACHE=${3:-}
cd "$(dirname "$0")/.."
PIP=(${PYTHON:-python3} -m pip)
# what the hosts' pip accepts for a binary wheel (pip does not widen an explicit --platform)
PLATFORMS=(manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64)
# dependencies PyPI has only as source: pure Python, so a wheel built here installs on any host
SOURCE_ONLY=(python-hostlist)
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml | head -1)
key=$(cat constraints.txt pyproject.toml <(echo "1|$PYV|${PLATFORMS[*]}|${SOURCE_ONLY[*]}") | sha256sum | cut -c1-16)
work=$(mktemp -d "${OUT%/}.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
# gpuhpc from a copy of this checkout's files (tracked and new, not ignored): no stale build/ goes in
mkdir "$work/src" "$work/wheels"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/src" 2>/dev/null || true
"${PIP[@]}" wheel -q --no-deps -w "$work/wheels" "$work/src"
deps=${CACHE:+$CACHE/$key}
if [ -z "$deps" ] || [ ! -f "$deps/.complete" ]; then
  dl=$work/deps
  mkdir "$dl"
  "${PIP[@]}" wheel -q --no-deps -c constraints.txt -w "$dl" "${SOURCE_ONLY[@]}"
  "${PIP[@]}" download -q --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${PLATFORMS[@]/#/--platform=}" -c constraints.txt --find-links "$work/wheels" --find-links "$dl" -d "$dl" \
    "gpuhpc[postgres]==$version"
  rm -f "$dl"/gpuhpc-*.whl
  touch "$dl/.complete"
  if [ -n "$deps" ]; then
    mkdir -p "$CACHE"; rm -rf "$deps"; mv "$dl" "$deps"
  else
    deps=$dl
  fi
  echo "wheelhouse: downloaded $(find "$deps" -name '*.whl' | wc -l) wheels for CPython $PYV${CACHE:+ into $deps}" >&2
fi
rm -rf "$OUT" && mkdir -p "$OUT"
cp -l "$deps"/*.whl "$OUT"/ 2>/dev/null || cp "$deps"/*.whl "$OUT"/
cp "$work"/wheels/gpuhpc-*.whl "$OUT"/
echo "wheelhouse: $OUT: gpuhpc $version and $(find "$deps" -name '*.whl' | wc -l) dependencies for CPython $PYV" >&2
