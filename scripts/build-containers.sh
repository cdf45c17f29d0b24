#!/usr/bin/env bash
# Build enroot and pyxis from their source archives into a prefix (docs/containers.md): the
# gpuhpc_containers role's script, which the role copies to each host; run here for tests and
# by hand. `scripts/build-containers.sh --help` for its options.
exec bash "$(dirname "$0")/../ansible/roles/gpuhpc_containers/files/build-containers.sh" "$@"
