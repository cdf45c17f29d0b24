#!/usr/bin/env bash
# lab.sh bake|up|down|status|ssh HOST CMD|ctl CMD|wipe - a 4-host Slurm lab on this one machine, for
# the multi-host deploy test (tests/integration/lab). Each host boots systemd as its PID 1 in its own
# network, mount, PID and UTS namespaces, on an overlay root whose lower layer is one Debian image
# baked once with debootstrap (cached in $LAB/image-$SUITE); its sshd is Debian's ssh.service.
# GPUHPC_LAB_SUITE picks the release: trixie (Debian 13, Slurm 24.11; the default: the 15 lab tests
# pass there, and a play takes no longer than on bookworm at the same load: first play 130 s against
# bookworm's 202-233 s on a 2-core machine at load 3-7; any play takes up to 4 times as long at load
# 30-70) or bookworm (Debian 12, Slurm 22.05, which the local cluster also runs).
#   ctl     10.213.0.11  slurmctld + slurmdbd + MariaDB
#   login   10.213.0.12  srun/sbatch, gpuhpc, the backup slurmctld
#   c1, c2  10.213.0.13-14  slurmd
# Every host mounts $LAB/shared on /shared (the site's shared filesystem: checkpoints, results, and
# the controllers' StateSaveLocation, /shared/slurm/state, which ctl and login share like NFS).
# Management network 10.213.0.0/24 on bridge br0 inside namespace lab-sw (the "switch", where the
# Ansible control node runs: `lab.sh ctl CMD`); every host also has an address on 10.213.1.0/24, the
# same wire but outside the management network (the nftables test connects from 10.213.1.1).
# Nothing is added to the root network namespace and nothing here listens on 127.0.0.1.
# A host that reboots (`systemctl reboot`, Slurm's RebootProgram) boots again on the same overlay, with
# a new boot id and uptime (supervise); a poweroff or `lab.sh down HOST` leaves it down.
# `lab.sh registry`: a container registry for the hosts on the switch, 10.213.0.1:5500
# (scripts/services/registry.sh, data in $LAB/registry), with its test image; prints the image pinned
# by digest and keeps it in $LAB/registry/image (the lab inventory's gpuhpc_containers_verify_image).
# Lab hosts have no route out: the packages the roles install are downloaded into the image when it
# is baked (PRESEED) and apt's index is the baked one.
set -euo pipefail
LAB=${GPUHPC_LAB_DIR:-/var/tmp/gpuhpc-lab}
SUITE=${GPUHPC_LAB_SUITE:-trixie}
case "$SUITE" in trixie|bookworm) ;; *) echo "lab.sh: GPUHPC_LAB_SUITE=$SUITE: use trixie or bookworm" >&2; exit 2 ;; esac
IMAGE=$LAB/image-$SUITE
KEY=$LAB/id_ed25519
NET=10.213.0
OUTNET=10.213.1
SELF=$(readlink -f "$0")
HOSTS=(ctl login c1 c2)
declare -A IP=([ctl]=11 [login]=12 [c1]=13 [c2]=14)
# installed in the image (the hosts' base system)
BASE="systemd systemd-sysv dbus python3 python3-apt openssh-server iproute2 procps sudo ca-certificates"
# only downloaded into the image's apt cache, with their recommends (as Ansible's apt installs them):
# the roles install them, for real, from there
PRESEED="munge slurm-client slurmd slurmctld slurmdbd mariadb-server libpam-slurm-adopt nftables mdadm xfsprogs python3-venv python3-packaging"
# and what gpuhpc_containers' build of enroot and pyxis needs and enroot runs (its script's list)
PRESEED+=" $(bash "${SELF%/*}/../ansible/roles/gpuhpc_containers/files/build-containers.sh" --packages)"

log() { echo "lab: $*" >&2; }

bake() {
  # debootstrap and the chroot commands run inside the image with this environment: a TMPDIR of this
  # machine (the suite's /var/tmp/gpuhpc-pytest) does not exist there (apt's and dpkg's mktemp failed)
  unset TMPDIR
  local stamp="$IMAGE/.gpuhpc-lab-baked" want
  want=$(echo "3|$SUITE|$BASE|$PRESEED" | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then log "image is current: $IMAGE"; return 0; fi
  command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null
  local t mirror
  t=$(date +%s)
  rm -rf "$IMAGE.new" && mkdir -p "$LAB"
  # the Debian mirror this machine's apt is configured with (deb822 sources, then sources.list)
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  debootstrap --variant=minbase "$SUITE" "$IMAGE.new" "$mirror" >/dev/null
  local R=$IMAGE.new
  printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"; chmod +x "$R/usr/sbin/policy-rc.d"
  unshare --mount --propagation private sh -ec "mount -t proc proc $R/proc
    chroot $R apt-get update -q=2
    chroot $R env DEBIAN_FRONTEND=noninteractive apt-get install -y -q=2 --no-install-recommends $BASE >/dev/null
    chroot $R apt-get clean
    chroot $R env DEBIAN_FRONTEND=noninteractive apt-get install -y -q=2 --download-only $PRESEED >/dev/null
    umount $R/proc"
  rm -f "$R/usr/sbin/policy-rc.d" "$R"/etc/ssh/ssh_host_*   # per-host keys and machine id: first boot
  # a systemd that boots in a container: no getty, no udev, no logind seat, no time sync
  for u in getty@tty1.service console-getty.service systemd-modules-load.service systemd-timesyncd.service \
           apt-daily.timer apt-daily-upgrade.timer; do
    chroot "$R" systemctl mask "$u" >/dev/null 2>&1 || true
  done
  echo "$want" > "$R/.gpuhpc-lab-baked"
  rm -rf "$IMAGE" && mv "$R" "$IMAGE"
  log "baked $IMAGE in $(( $(date +%s) - t )) s, $(du -sh "$IMAGE" | cut -f1)"
}

# PID 1 of a host's fresh mount/PID/UTS namespace (inside its network namespace): overlay root, host
# keys on the first boot, then systemd. Debian's units start sshd; the roles start everything else.
host_init() {
  unset TMPDIR   # a path of this machine, not of the host's root (as in bake)
  local h=$1 d=$LAB/hosts/$1 M=$LAB/hosts/$1/merged
  # made on one CPU (oldest_ns_cpu); the host runs on all of them
  taskset -p -c "$GPUHPC_LAB_CPUS" $$ >/dev/null
  mount --make-rprivate /
  mount -t overlay overlay -o "lowerdir=$IMAGE,upperdir=$d/upper,workdir=$d/work" "$M"
  if [ ! -f "$d/upper/etc/ssh/.gpuhpc-lab-hostkeys" ]; then
    chroot "$M" ssh-keygen -A >/dev/null && touch "$M/etc/ssh/.gpuhpc-lab-hostkeys"
    tr -d '-' < /proc/sys/kernel/random/uuid > "$M/etc/machine-id"   # journald/dbus: one id per host
  fi
  echo "$h" > "$M/etc/hostname"
  { echo "127.0.0.1 localhost"; for x in "${HOSTS[@]}"; do echo "$NET.${IP[$x]} $x"; done; } > "$M/etc/hosts"
  mkdir -p -m 700 "$M/root/.ssh"; install -m 600 "$KEY.pub" "$M/root/.ssh/authorized_keys"
  # no route out: apt's index is the image's, and the roles' packages are in its cache
  mkdir -p "$M/var/lib/apt/periodic"; touch "$M/var/lib/apt/periodic/update-success-stamp"
  # a cgroup of its own in every hierarchy: the host's systemd takes it as the root of its tree
  local c
  for c in $(awk '$3 == "cgroup" {print $2}' /proc/self/mounts); do
    mkdir -p "$c/gpuhpc-lab/$h"
    if [ -f "$c/cpuset.cpus" ]; then   # cpuset: a new cgroup starts with no CPUs and no memory nodes
      cat "$c/cpuset.cpus" > "$c/gpuhpc-lab/cpuset.cpus"; cat "$c/cpuset.mems" > "$c/gpuhpc-lab/cpuset.mems"
      cat "$c/cpuset.cpus" > "$c/gpuhpc-lab/$h/cpuset.cpus"; cat "$c/cpuset.mems" > "$c/gpuhpc-lab/$h/cpuset.mems"
    fi
    echo $$ > "$c/gpuhpc-lab/$h/cgroup.procs"
  done
  # and in the unified hierarchy, which systemd (hybrid mode) reads its root from
  mkdir -p "$d/cg2" && mount -t cgroup2 cgroup2 "$d/cg2"
  mkdir -p "$d/cg2/gpuhpc-lab/$h" && echo $$ > "$d/cg2/gpuhpc-lab/$h/cgroup.procs"
  umount "$d/cg2"
  mount -t proc proc "$M/proc"
  new_boot_id "$d" "$M"
  mount -t sysfs sys "$M/sys"
  mount --rbind /sys/fs/cgroup "$M/sys/fs/cgroup"
  mount -t tmpfs -o mode=755 tmpfs "$M/run"
  mount -t tmpfs -o mode=1777 tmpfs "$M/tmp"
  mount --bind /dev "$M/dev"
  # the host's "local NVMe": a directory on this machine's real disk (job_container/tmpfs cannot
  # make its per-job namespaces on the overlay root)
  mkdir -p "$d/scratch" "$M/scratch"; mount --bind "$d/scratch" "$M/scratch"
  # a filesystem every host shares (a site's NFS home): job inputs, checkpoints, results
  mkdir -p "$LAB/shared" "$M/shared"; mount --bind "$LAB/shared" "$M/shared"
  : > "$d/console"; mount --bind "$d/console" "$M/dev/console"   # systemd's console: a file per host
  hostname "$h"
  # the overlay becomes the namespace's root (pivot_root, not chroot: a process that joins a mount
  # namespace with setns(2), as job_container/tmpfs's steps do, lands on the namespace's root)
  cd "$M" && pivot_root . mnt && umount -l /mnt
  exec /lib/systemd/systemd --system --log-target=console
}

pid1() {   # the host's PID 1 (systemd), as this machine sees it; nothing when the host is down
  local f=$LAB/hosts/$1/unshare.pid
  [ -f "$f" ] && pgrep -P "$(cat "$f")" 2>/dev/null | head -1 || true
}

# The CPU on which a new mount namespace gets the smallest id. Linux (seen on 6.18) numbers mount
# namespaces from per-CPU batches, so a namespace made later on another CPU may get a smaller id, and
# the kernel refuses to bind-mount a mount namespace whose id is not above the caller's (EINVAL; the
# loop check in fs/namespace.c). job_container/tmpfs does exactly that for every job: slurmstepd binds
# /proc/CHILD/ns/mnt onto BasePath/JOB/.ns from slurmd's namespace. On a real node slurmd lives in the
# boot namespace, older than any; a lab host's namespace is young, so it is made on this CPU, and the
# namespaces its jobs make later, on any CPU, are numbered above it. (Without the ioctl, on kernels
# that number them in order: any CPU.)
oldest_ns_cpu() {
  python3 - <<'EOF'
import ctypes, fcntl, os, struct
NS_GET_MNTNS_ID = 0x8008B705          # _IOR(0xb7, 5, __u64), Linux >= 6.7
libc = ctypes.CDLL(None, use_errno=True)
ids = {}
for cpu in sorted(os.sched_getaffinity(0)):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {cpu})
            assert libc.unshare(0x20000) == 0      # CLONE_NEWNS
            fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
            buf = bytearray(8)
            fcntl.ioctl(fd, NS_GET_MNTNS_ID, buf)
            os.write(w, buf)
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 8)
    os.waitpid(pid, 0)
    if len(got) == 8:
        ids[cpu] = struct.unpack("Q", got)[0]
print(min(ids, key=ids.get) if ids else ",".join(map(str, sorted(os.sched_getaffinity(0)))))
EOF
}

# Each boot is a boot as the host's software sees it: its own /proc/sys/kernel/random/boot_id (a new
# one bound over the machine's, as systemd-nspawn does; journald and `journalctl -b` read it) and, in
# its time namespace (start_host), an uptime counted from this boot, which slurmd reports as BootTime.
new_boot_id() {
  cat /proc/sys/kernel/random/uuid > "$1/boot_id"
  mount --bind "$1/boot_id" "$2/proc/sys/kernel/random/boot_id"
  mount -o remount,bind,ro "$2/proc/sys/kernel/random/boot_id"
}

# A host's power supply: boots it, and boots it again on the same overlay when its systemd reboots
# (`systemctl reboot`, Slurm's RebootProgram). reboot(2) from a PID namespace's init ends that init
# as if killed by SIGHUP (halt and poweroff: SIGINT), and unshare re-raises its child's signal, so
# 129 is a reboot; anything else (a poweroff, stop_host's SIGKILL: a power cut) leaves the host down.
# It runs detached from the caller and holds none of its descriptors (a `flock lab.lock lab.sh up`
# must not leave the lock held by the hosts).
supervise() {
  local h=$1 d=$LAB/hosts/$1 rc fd cpus
  for fd in $(ls /proc/$BASHPID/fd); do [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ] && eval "exec $fd>&-"; done
  cpus=$(taskset -p -c $BASHPID | awk '{print $NF}')
  while [ ! -e "$d/poweroff" ]; do
    # nsenter, not `ip netns exec`: that one remounts /sys, hiding the cgroup hierarchies systemd needs;
    # the mount namespace is made on the CPU that numbers namespaces lowest (oldest_ns_cpu); the time
    # namespace starts the host's CLOCK_BOOTTIME (its uptime) at 0
    GPUHPC_LAB_CPUS=$cpus taskset -c "$(oldest_ns_cpu)" \
      nsenter --net="/run/netns/lab-$h" unshare --mount --pid --uts --time --boottime "-$(cut -d. -f1 /proc/uptime)" \
      --fork --propagation private "$SELF" _init "$h" > "$d/init.log" 2>&1 &
    echo $! > "$d/unshare.pid.new" && mv "$d/unshare.pid.new" "$d/unshare.pid"
    rc=0; wait $! || rc=$?
    # (an unshare that fails to re-raise the signal says so, as in up(): that child ended by a signal too)
    [ "$rc" -eq 1 ] && grep -q "sigprocmask" "$d/init.log" && rc=129
    [ "$rc" -eq 129 ] && [ ! -e "$d/poweroff" ] || { log "$h: down (exit $rc)"; return 0; }
    log "$h: rebooting"
    clean_cgroups "$h"
    # a machine's reset and firmware take their time too; and slurmctld takes a node it asked to
    # reboot as rebooted only when its BootTime (now - uptime, in whole seconds) is after the request
    sleep 3
  done
}

clean_cgroups() {   # a stopped host's (now empty) cgroups, deepest first
  local h=$1 d=$LAB/hosts/$1
  find $(awk '$3 == "cgroup" {print $2 "/gpuhpc-lab/'"$h"'"}' /proc/self/mounts) -depth -type d -exec rmdir {} + 2>/dev/null || true
  mkdir -p "$d/cg2" && unshare --mount sh -c "mount -t cgroup2 cgroup2 $d/cg2 &&
    find $d/cg2/gpuhpc-lab/$h -depth -type d -exec rmdir {} + 2>/dev/null" || true
}

start_host() {
  local h=$1 d=$LAB/hosts/$1 t
  [ -n "$(pid1 "$h")" ] && { log "$h is running"; return 0; }
  mkdir -p "$d/upper" "$d/work" "$d/merged"
  ip netns add "lab-$h" 2>/dev/null || true
  if ! ip -n lab-sw link show "v$h" >/dev/null 2>&1; then
    ip -n lab-sw link add "v$h" type veth peer name eth0 netns "lab-$h"
    ip -n lab-sw link set "v$h" master br0 up
    ip -n "lab-$h" link set lo up
    ip -n "lab-$h" addr add "$NET.${IP[$h]}/24" dev eth0
    ip -n "lab-$h" addr add "$OUTNET.${IP[$h]}/24" dev eth0
    ip -n "lab-$h" link set eth0 up
  fi
  rm -f "$d/unshare.pid" "$d/poweroff"
  setsid "$SELF" _supervise "$h" </dev/null >> "$d/supervisor.log" 2>&1 &
  for t in $(seq 100); do [ -f "$d/unshare.pid" ] && return 0; sleep 0.1; done
  log "$h: its supervisor did not boot it; see $d/supervisor.log"; return 1
}

wait_ssh() {
  local h=$1 t
  for t in $(seq 300); do
    kill -0 "$(cat "$LAB/hosts/$h/unshare.pid")" 2>/dev/null || break
    ip netns exec lab-sw bash -c "exec 3<>/dev/tcp/$NET.${IP[$h]}/22 && head -c4 <&3" 2>/dev/null | grep -q SSH && return 0
    sleep 0.2
  done
  log "$h: sshd did not come up; see $LAB/hosts/$h/console and init.log"; tail -20 "$LAB/hosts/$h/init.log" >&2; return 1
}

known_hosts() {
  local h
  for h in "${HOSTS[@]}"; do
    [ -f "$LAB/hosts/$h/upper/etc/ssh/ssh_host_ed25519_key.pub" ] || continue
    echo "$h,$NET.${IP[$h]} $(cut -d' ' -f1,2 "$LAB/hosts/$h/upper/etc/ssh/ssh_host_ed25519_key.pub")"
  done > "$LAB/known_hosts.new"
  mv "$LAB/known_hosts.new" "$LAB/known_hosts"
}

up() {
  bake
  local t h
  t=$(date +%s%N)
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C gpuhpc-lab -f "$KEY"
  if ! ip netns list | grep -qw lab-sw; then
    ip netns add lab-sw
    ip -n lab-sw link set lo up
    ip -n lab-sw link add br0 type bridge
    ip -n lab-sw addr add "$NET.1/24" dev br0
    ip -n lab-sw addr add "$OUTNET.1/24" dev br0
    ip -n lab-sw link set br0 up
  fi
  for h in "${@:-${HOSTS[@]}}"; do start_host "$h"; done
  for h in "${@:-${HOSTS[@]}}"; do
    wait_ssh "$h" && continue
    # util-linux's unshare sometimes dies at once on a loaded machine ("sigprocmask unblock failed:
    # Invalid argument"), before the host's init runs: boot that host once more
    grep -q "sigprocmask" "$LAB/hosts/$h/init.log" 2>/dev/null || return 1
    log "$h: unshare failed to start; booting it again"
    stop_host "$h"; start_host "$h"; wait_ssh "$h"
  done
  known_hosts
  log "up: ${*:-${HOSTS[*]}} in $(( ($(date +%s%N) - t) / 1000000 )) ms (ssh answers on every host)"
}

stop_host() {
  local h=$1 d=$LAB/hosts/$1 p
  p=$(pid1 "$h")
  [ ! -d "$d" ] || touch "$d/poweroff"   # for its supervisor: no boot after this
  mux_exit "$h"
  # SIGKILL to the namespace's init: the kernel ends every process of the host (a power cut)
  [ -n "$p" ] && kill -KILL "$p" 2>/dev/null || true
  [ -f "$d/unshare.pid" ] && { wait_gone "$(cat "$d/unshare.pid")"; rm -f "$d/unshare.pid"; }
  # the host's (now empty) cgroups, deepest first
  find $(awk '$3 == "cgroup" {print $2 "/gpuhpc-lab/'"$h"'"}' /proc/self/mounts) -depth -type d -exec rmdir {} + 2>/dev/null || true
  mkdir -p "$d/cg2" && unshare --mount sh -c "mount -t cgroup2 cgroup2 $d/cg2 &&
    find $d/cg2/gpuhpc-lab/$h -depth -type d -exec rmdir {} + 2>/dev/null" || true
}

wait_gone() { local t; for t in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; }

down() {
  local h
  for h in "${@:-${HOSTS[@]}}"; do
    stop_host "$h"
    [ $# -gt 0 ] || { ip netns del "lab-$h" 2>/dev/null || true; }
  done
  [ $# -gt 0 ] || { D=$LAB/registry bash "${SELF%/*}/services/registry.sh" stop 2>/dev/null || true; }
  [ $# -gt 0 ] || { ip netns del lab-sw 2>/dev/null || true; }
  log "down: ${*:-all}"
}

status() {
  local h p rc=0
  for h in "${HOSTS[@]}"; do
    p=$(pid1 "$h")
    if [ -n "$p" ]; then
      echo "$h $NET.${IP[$h]} pid1=$p $(ip netns exec lab-sw timeout 5 ssh "${SSH_OPTS[@]}" "root@$NET.${IP[$h]}" systemctl is-system-running 2>/dev/null || true)"
    else
      echo "$h $NET.${IP[$h]} down"; rc=3
    fi
  done
  return $rc
}

SSH_OPTS=(-o BatchMode=yes -o StrictHostKeyChecking=yes -o "UserKnownHostsFile=$LAB/known_hosts" -i "$KEY")
# `lab.sh ssh HOST` goes through one master connection per host, $LAB/mux-HOST (a handshake costs ~1 s
# on a loaded machine, and the tests run hundreds of commands); Ansible keeps its own (the inventory's)
# A master is started unless one answers: one at a time (flock), over no socket left behind, detached
# with its output to /dev/null (a ControlPersist master forked by the command itself would keep the
# caller's stdout/stderr pipes open until it exits)
mux() {
  local ip=$NET.${IP[$1]} cp=$LAB/mux-$1
  ip netns exec lab-sw ssh "${SSH_OPTS[@]}" -o "ControlPath=$cp" -O check "root@$ip" 2>/dev/null && return 0
  ( flock 9
    ip netns exec lab-sw ssh "${SSH_OPTS[@]}" -o "ControlPath=$cp" -O check "root@$ip" 2>/dev/null && exit 0
    rm -f "$cp"
    ip netns exec lab-sw ssh "${SSH_OPTS[@]}" -o "ControlPath=$cp" -o ControlMaster=yes -o ControlPersist=60 \
      -fN "root@$ip" </dev/null >/dev/null 2>&1 9>&- || true   # the master must not hold the lock
  ) 9>"$LAB/mux.lock"
}
mux_exit() {
  ip netns exec lab-sw ssh "${SSH_OPTS[@]}" -o "ControlPath=$LAB/mux-$1" -O exit "root@$NET.${IP[$1]}" >/dev/null 2>&1 || true
}

case "${1:-}" in
  _init) host_init "$2" ;;
  # exit before bash reads on: a supervisor outlives edits of this file (its offset would point anywhere)
  _supervise) supervise "$2"; exit 0 ;;
  up) shift; up "$@" ;;
  down) shift; down "$@" ;;
  status) status ;;
  # the controllers' state on the shared filesystem goes with the hosts (a fresh lab has no jobs)
  wipe) down; rm -rf "$LAB/hosts" "$LAB/known_hosts" "$LAB/shared/slurm" ;;
  ssh) h=$2; shift 2; mux "$h"
       exec ip netns exec lab-sw ssh "${SSH_OPTS[@]}" -o "ControlPath=$LAB/mux-$h" -o ControlMaster=no "root@$NET.${IP[$h]}" "$@" ;;
  ctl) shift; exec ip netns exec lab-sw "$@" ;;
  bake) bake ;;
  registry) mkdir -p "$LAB/registry"
            bash "${SELF%/*}/services/registry.sh" packages   # here: the switch has no route out
            D=$LAB/registry ADDR=$NET.1 ip netns exec lab-sw bash "${SELF%/*}/services/registry.sh" start \
              | tail -n 1 | tee "$LAB/registry/image.new"
            mv "$LAB/registry/image.new" "$LAB/registry/image" ;;
  *) echo "usage: scripts/lab.sh bake|up|down|status|wipe|registry|ssh HOST [CMD]|ctl CMD" >&2; exit 2 ;;
esac
