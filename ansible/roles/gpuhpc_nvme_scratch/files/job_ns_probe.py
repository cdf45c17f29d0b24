#!/usr/bin/env python3
"""Can slurmd hold a job's mount namespace under BasePath? (gpuhpc_nvme_scratch verify)

job_container/tmpfs (Slurm 22.05) makes every job's namespace in a child of slurmstepd and keeps it
by bind-mounting /proc/CHILD/ns/mnt onto BasePath/JOB/.ns from slurmd's mount namespace. Linux
refuses that bind (EINVAL) unless the job's namespace is numbered above slurmd's, and recent kernels
(seen on 6.18) number mount namespaces from per-CPU batches: a slurmd in a young namespace (a
container, a unit with PrivateTmp= or ProtectSystem=) then loses jobs at random, depending on the
CPU. This does what slurmstepd does, from slurmd's namespace, once per CPU.

usage: job_ns_probe.py SLURMD_PID BASEPATH    prints "ok N cpus" or one line naming the failure; exit 1
"""
import ctypes
import os
import sys

CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 0x20000, 4096, 16384, 1 << 18, 2
libc = ctypes.CDLL(None, use_errno=True)


def probe(cpu: int, holder: str) -> str:
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:       # the job's namespace, made on this CPU
        os.sched_setaffinity(0, {cpu})
        ok = libc.unshare(CLONE_NEWNS) == 0
        os.write(w, b"1" if ok else b"0")
        os.read(r2, 1)
        os._exit(0)
    try:
        if os.read(r, 1) != b"1":
            return f"unshare(CLONE_NEWNS) failed on CPU {cpu}"
        if libc.mount(f"/proc/{pid}/ns/mnt".encode(), holder.encode(), None, MS_BIND, None) != 0:
            return os.strerror(ctypes.get_errno())
        libc.umount2(holder.encode(), MNT_DETACH)
        return ""
    finally:
        os.write(w2, b"x")
        os.waitpid(pid, 0)


def main() -> int:
    slurmd_pid, base = sys.argv[1], sys.argv[2]
    fd = os.open(f"/proc/{slurmd_pid}/ns/mnt", os.O_RDONLY)
    if libc.setns(fd, CLONE_NEWNS) != 0:
        print(f"cannot enter slurmd's mount namespace: {os.strerror(ctypes.get_errno())}")
        return 1
    # as slurmstepd does: the job's directory bound onto itself and made private, the holder in it
    job = os.path.join(base, f".gpuhpc-probe-{os.getpid()}")
    os.mkdir(job, 0o700)
    try:
        if (libc.mount(job.encode(), job.encode(), None, MS_BIND, None) != 0
                or libc.mount(None, job.encode(), None, MS_PRIVATE | MS_REC, None) != 0):
            print(f"cannot bind-mount {job} onto itself: {os.strerror(ctypes.get_errno())}")
            return 1
        holder = os.path.join(job, ".ns")
        open(holder, "w").close()
        cpus = sorted(os.sched_getaffinity(0))
        for cpu in cpus:
            err = probe(cpu, holder)
            if err:
                print(f"a job's namespace made on CPU {cpu} cannot be held under {base} ({err}): "
                      "run slurmd in the boot mount namespace (no PrivateTmp=/ProtectSystem= on its unit, not in a container)")
                return 1
    finally:
        libc.umount2(job.encode(), MNT_DETACH)
        for name in os.listdir(job):
            os.unlink(os.path.join(job, name))
        os.rmdir(job)
    print(f"ok {len(cpus)} cpus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
