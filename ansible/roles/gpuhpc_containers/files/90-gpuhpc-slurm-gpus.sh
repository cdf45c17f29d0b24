#! /usr/bin/env bash
# gpuhpc (docs/containers.md), an enroot hook run before enroot's 98-nvidia.sh: an image that asks
# for GPUs (NVIDIA_VISIBLE_DEVICES=all, as NGC images do) gets exactly the Slurm job's GPUs on this
# node, not every GPU of the node. 98-nvidia.sh asks nvidia-container-cli for --device=<the last
# NVIDIA_VISIBLE_DEVICES of the container's environment file> unless the job's own environment
# sets it (pyxis passes the job's environment): that case is left alone (the device cgroup binds).
# A job with no GPU on this node gets none (void: no nvidia-container-cli call on a CPU node).
set -euo pipefail
[ -n "${SLURM_JOB_ID-}" ] || exit 0                     # not a Slurm job: enroot's own behaviour
[ -z "${NVIDIA_VISIBLE_DEVICES+x}" ] || exit 0          # set by the job: 98-nvidia.sh uses it
want=$(grep '^NVIDIA_VISIBLE_DEVICES=' "${ENROOT_ENVIRON}" | tail -n 1 | cut -d= -f2-) || want=
case "${want}" in ""|void|none) exit 0 ;; esac
# the step's GPUs (global indices, as nvidia-container-cli counts them), else the job's
gpus=${SLURM_STEP_GPUS-${SLURM_JOB_GPUS-}}
case "${gpus}" in *[!0-9,]*) gpus= ;; esac              # UUIDs or MIG names are not Slurm's indices here
echo "NVIDIA_VISIBLE_DEVICES=${gpus:-void}" >> "${ENROOT_ENVIRON}"
