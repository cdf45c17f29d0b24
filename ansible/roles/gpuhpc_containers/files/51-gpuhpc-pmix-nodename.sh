#!/usr/bin/env bash
# gpuhpc (gpuhpc_containers role): enroot's 50-slurm-pmi.sh, which runs just before this hook, reads
# SlurmdSpoolDir and TmpFS from `scontrol show config`, which prints them as slurm.conf has them. Where
# they hold %n (one slurmd per node on a shared host: runtime.multiple_slurmd), its mounts name a
# literal "%n" directory that does not exist, and every PMIx step in an image fails
# ("enroot-mount: failed to mount"). slurmd expands %n to the node's name (SLURMD_NODENAME in the
# step): this hook puts the expanded directories in place of those lines, with the same options.
set -euo pipefail

[ -n "${SLURM_JOB_ID-}" ] && [ -n "${SLURM_STEP_ID-}" ] && [ -n "${SLURMD_NODENAME-}" ] || exit 0
[ -n "${ENROOT_MOUNTS-}" ] && [ -f "${ENROOT_MOUNTS}" ] || exit 0
grep -q '%n' "${ENROOT_MOUNTS}" || exit 0

node=${SLURMD_NODENAME}
step="${SLURM_JOB_ID}.${SLURM_STEP_ID}"
kept=$(grep -v '%n' "${ENROOT_MOUNTS}" || true)
{
  [ -z "${kept}" ] || printf '%s\n' "${kept}"
  grep '%n' "${ENROOT_MOUNTS}" | while read -r path options; do
    path=${path//%n/${node}}
    # 50-slurm-pmi.sh picked the application directory's name by whether it exists, which it could
    # not see: Slurm 22.05 and later name it spmix_appdir_<uid>_<job>.<step>
    case "${path}" in
      */spmix_appdir_"${step}")
        with_uid="${path%/*}/spmix_appdir_${SLURM_JOB_UID-}_${step}"
        [ -e "${with_uid}" ] && path=${with_uid} ;;
    esac
    printf '%s %s\n' "${path}" "${options}"
  done
} > "${ENROOT_MOUNTS}.gpuhpc"
cat "${ENROOT_MOUNTS}.gpuhpc" > "${ENROOT_MOUNTS}"
rm -f "${ENROOT_MOUNTS}.gpuhpc"
