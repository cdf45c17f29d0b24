#!/bin/bash
# enroot hook (gpuhpc_containers role; docs/containers.md, "Per-user directories"): runs first, as
# the user, before anything of the image runs. enroot trusts a cached layer by its file name and
# reuses a container's root filesystem by its directory name, so its cache and data directories
# must be this user's own and closed to everybody else: else refuse to start the container, naming
# the directory (another user may have made it and put layers or a root filesystem in it).
# (ENROOT_RUNTIME_PATH is not checked here: enroot mounts a private tmpfs over it before the hooks.)
set -eu
me=$(id -u)
for var in ENROOT_CACHE_PATH ENROOT_DATA_PATH; do
  d=${!var:-}
  [ -n "$d" ] || continue
  if [ -L "$d" ] || [ ! -d "$d" ]; then
    echo "gpuhpc: refusing to start the container: enroot directory $d ($var) is not a directory (a symlink or missing); have root remove it and rerun" >&2
    exit 1
  fi
  read -r owner mode < <(stat -c '%u %a' -- "$d")
  if [ "$owner" != "$me" ]; then
    echo "gpuhpc: refusing to start the container: enroot directory $d ($var) belongs to another user (uid $owner as this namespace sees it), not to you (uid $me): they may have put image layers in it; have root remove it (rm -rf $d) and rerun" >&2
    exit 1
  fi
  if [ $(( 0$mode & 077 )) -ne 0 ]; then
    echo "gpuhpc: refusing to start the container: enroot directory $d ($var) has mode $mode, open to other users (must be 0700): they may have put image layers in it; have root remove it (rm -rf $d) and rerun" >&2
    exit 1
  fi
done
