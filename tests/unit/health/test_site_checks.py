"""The checks of the broken nodes a site sees (issue 35.9), each on recorded text (a healthy and a
broken example: the hand-made outputs in ``fixtures/`` and the real ``nvidia-smi -q`` captures in
``tests/fixtures/nvidia-smi``), then wired through ``check_node`` on a scripted node: the drain
reason names the check and its class (hw sticky, dev and sw return once clean), a missing tool
or spec setting is a skip, never a drain."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuhpc.errors import TransportError, UserInputError
from gpuhpc.health import HealthSpec, check_node
from gpuhpc.health import checks as c
from gpuhpc.health import collect
from gpuhpc.health.spec import load
from gpuhpc.slurm.parsers import NodeInfo
from gpuhpc.transport import CommandResult

FIX = Path(__file__).parent / "fixtures"
NODE = "gpu-node1"
GRES = "/etc/slurm/gres.conf"


def fx(name: str) -> str:
    return (FIX / name).read_text()


@pytest.fixture
def q_text(fixtures_dir) -> str:
    return (fixtures_dir / "nvidia-smi" / "q-text-h100-sxm-8gpu-535.183.01.txt").read_text()


# ------------------------------------------------------------------ the pure checks on recorded text
def test_gpu_processes_left_without_a_job_fail_dev_and_name_the_processes():
    r = c.check_gpu_processes(fx("query-compute-apps-leftover.txt"), jobs_running=False)
    assert (r.status, r.category) == (c.Status.FAIL, c.DEV)
    assert r.message == "gpu processes left: 1002127 python, 1002311 python3.11"
    # with a job on the node its processes are its own; none at all is clean; DCGM's nvvs never counts
    assert c.check_gpu_processes(fx("query-compute-apps-leftover.txt"), jobs_running=True).status is c.Status.OK
    assert c.check_gpu_processes("", jobs_running=False).status is c.Status.OK
    assert c.check_gpu_processes(fx("query-compute-apps-dcgm.txt"), jobs_running=False).status is c.Status.OK
    assert c.check_gpu_processes(fx("query-compute-apps-dcgm.txt"), jobs_running=False,
                                 ignore=()).status is c.Status.FAIL
    # Slurm's view unknown: skipped, never a guess
    assert c.check_gpu_processes(fx("query-compute-apps-leftover.txt"), jobs_running=None).status is c.Status.SKIP


@pytest.mark.parametrize("state, running", [("IDLE", False), ("IDLE+COMPLETING", False), ("IDLE+DRAIN", False),
                                            ("MIXED", True), ("ALLOCATED+DRAIN", True), ("MIXED+COMPLETING", True)])
def test_jobs_running_from_the_node_state(state, running):
    assert c.jobs_running(state) is running


def test_host_memory_and_cpus_against_the_expected():
    assert c.check_host(fx("meminfo-2tb.txt"), "224\n", memory_mb=2_000_000, cpus=224).status is c.Status.OK
    r = c.check_host(fx("meminfo-2tb-dimm-lost.txt"), "223\n", memory_mb=2_000_000, cpus=224)
    assert (r.status, r.category) == (c.Status.FAIL, c.HW)
    assert r.message == "host memory 1998243/2000000 MB; host cpus 223/224"
    assert c.check_host(None, None, memory_mb=None, cpus=None).status is c.Status.SKIP
    assert c.check_host("", "x", memory_mb=1, cpus=1).message == "host memory unreadable; host cpus unreadable"


IBSTAT = "".join(f"CA '{ca}'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: Active\n"
                 f"\t\tPhysical state: LinkUp\n\t\tRate: 400\n\t\tLink layer: InfiniBand\n"
                 for ca in ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5"))


def perfquery(mlx5_1: str) -> dict[tuple, str]:
    """The scripted node's ``perfquery -C CA -P 1`` answers: mlx5_1 from the given recording."""
    return {("perfquery", "-C", ca, "-P", "1"): fx(mlx5_1 if ca == "mlx5_1" else "perfquery-port-clean.txt")
            for ca in ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5")}
MOUNTS = ("/dev/md0 /scratch xfs rw,relatime 0 0\n"
          "nfs1:/export/shared /shared nfs4 rw,relatime,vers=4.2 0 0\n"
          "/dev/sdb1 /data ext4 ro,relatime 0 0\n")


def test_filesystems_mounted_read_write_and_writable():
    ok = c.check_filesystems(["/scratch", "/shared/"], MOUNTS, {"/scratch": None, "/shared": None})
    assert ok.status is c.Status.OK and ok.category == c.SW
    r = c.check_filesystems(["/scratch", "/shared", "/data", "/lustre"], MOUNTS,
                            {"/scratch": "create: Permission denied", "/shared": None})
    assert (r.status, r.category) == (c.Status.FAIL, c.SW)
    assert r.message == ("fs /scratch not writable (create: Permission denied); fs /data read-only; "
                         "fs /lustre not mounted")
    assert c.check_filesystems([], MOUNTS, {}).status is c.Status.SKIP


def test_pcie_width_strict_generation_not_compared():
    r = c.check_pcie(fx("query-pcie-h100x8-idle.txt"))
    assert r.status is c.Status.OK, r        # gen 1 of 5 at idle is fine
    r = c.check_pcie(fx("query-pcie-h100x8-gpu2-x8.txt"))
    assert (r.status, r.category, r.message) == (c.Status.FAIL, c.HW, "pcie gpu2 x8/x16")
    # the spec's width wins over what the link says it could do
    assert c.check_pcie(fx("query-pcie-h100x8-idle.txt"), width=32).message.startswith("pcie gpu0 x16/x32")
    # rows of another query (the counters) are not PCIe figures: skip
    assert c.check_pcie("0, 0, No, 0, 0, 0x0, 1980, 1980\n").status is c.Status.SKIP


def test_nvlink_inactive_link_fails_hw():
    assert c.check_nvlink(fx("nvlink-status-h100x8.txt"), links=18, min_gbps=25).status is c.Status.OK
    r = c.check_nvlink(fx("nvlink-status-h100x8-gpu5-link7-inactive.txt"), links=18)
    assert (r.status, r.category, r.message) == (c.Status.FAIL, c.HW, "nvlink gpu5 link 7 inactive")
    r = c.check_nvlink(fx("nvlink-status-h100x8.txt"), links=18, min_gbps=50)
    assert r.status is c.Status.FAIL and r.message.startswith("nvlink gpu0 link 0 26.562")
    assert c.check_nvlink(fx("nvlink-status-h100x8.txt"), links=12).status is c.Status.OK
    assert c.check_nvlink(fx("nvlink-status-h100x8.txt"), links=20).message.startswith("nvlink gpu0 links 18/20")
    zero = "GPU 0: X (UUID: GPU-a)\n\t Link 0: 0 GB/s\n"
    assert c.check_nvlink(zero, links=1).message == "nvlink gpu0 link 0 inactive"
    assert c.check_nvlink(None, links=None).status is c.Status.SKIP


PORTS = ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5")


def ib_counters(mlx5_1: str) -> dict[str, dict[str, int]]:
    """Four ports' perfquery counters: mlx5_1 from the given recording, the others clean."""
    return {f"{ca}/1": c.parse_perfquery(fx(mlx5_1 if ca == "mlx5_1" else "perfquery-port-clean.txt")) for ca in PORTS}


def test_ib_counters_growth_since_the_last_run_of_this_boot():
    assert c.parse_perfquery(fx("perfquery-port-1-down.txt")) == {"link_downed": 1, "symbol_error": 0}
    before = ib_counters("perfquery-port-1-down.txt")
    after = ib_counters("perfquery-port-flapped.txt")
    r = c.check_ib_counters(after, before)
    assert (r.status, r.category, r.message) == (c.Status.FAIL, c.DEV, "ib mlx5_1/1 link downed +3")
    assert c.check_ib_counters(after, before, max_link_downed=3).status is c.Status.OK
    # old errors (the counts already there) are not news; the first run of a boot only records
    assert c.check_ib_counters(before, before).status is c.Status.OK
    assert c.check_ib_counters(after, None).status is c.Status.OK
    # the state file: kept per boot; another boot's counts are no baseline
    text = c.ib_counters_text(before, "boot-a")
    assert c.ib_counters_state(text, "boot-a") == before
    assert c.ib_counters_state(text, "boot-b") is None and c.ib_counters_state("junk", "boot-a") is None
    # counters cleared (perfquery -R) and grown again: counted from zero
    cleared = {p: dict(v) for p, v in after.items()}
    cleared["mlx5_4/1"]["symbol_error"] = 2
    assert c.check_ib_counters(cleared, after).message == "ib mlx5_4/1 symbol errors +2"


def test_nv_peermem_loaded_where_gpudirect_is_configured():
    assert c.check_peermem(fx("proc-modules-peermem.txt"), required=True).status is c.Status.OK
    r = c.check_peermem(fx("proc-modules-no-peermem.txt"), required=True)
    assert (r.status, r.category, r.message) == (c.Status.FAIL, c.SW, "nv_peermem not loaded")
    assert c.check_peermem("nv_peer_mem 16384 0 - Live 0x0 (OE)\n", required=True).status is c.Status.OK
    assert c.check_peermem(None, required=False).status is c.Status.SKIP


def _fabric_broken(q: str) -> str:
    """The real capture with the fourth GPU's fabric registration still in progress."""
    head, sep, rest = q.partition("GPU 00000000:75:00.0")
    assert sep
    done = "State                             : Completed\n        Status                            : Success"
    rest = rest.replace(done, done.replace("Completed", "In Progress").replace("Success", "N/A"), 1)
    return head + sep + rest


def test_fabric_manager_from_the_real_capture(q_text):
    fabric = c.parse_fabric(q_text)
    assert len(fabric) == 8 and fabric[0] == ("00000000:53:00.0", "Completed", "Success")
    assert c.check_fabric_manager(q_text, None, required=True).message == "8 GPUs registered with the fabric"
    r = c.check_fabric_manager(_fabric_broken(q_text), None, required=True)
    assert (r.status, r.category) == (c.Status.FAIL, c.HW)
    assert r.message == "fabric manager gpu 00000000:75:00.0 in progress n/a"
    # a driver without the fabric state: the service decides
    assert c.check_fabric_manager("", "active\n", required=True).status is c.Status.OK
    assert c.check_fabric_manager("", "failed\n", required=True).message == "fabric manager failed"
    assert c.check_fabric_manager("", None, required=True).status is c.Status.FAIL
    assert c.check_fabric_manager(q_text, None, required=False).status is c.Status.SKIP


def test_spec_keys_for_the_site_checks():
    s = load("host: {memory_mb: slurm, cpus: 224}\nfilesystems: [/scratch]\npcie: {width: 16}\n"
             "nvlink: {links: 18, min_gbps: 26}\nib: {min_rate: 400, max_link_downed: 1}\ngpudirect: true\n"
             "fabric_manager: true\ngpu_processes: {ignore: [nvvs]}\n")
    assert (s.host_memory_mb, s.host_cpus, s.filesystems, s.pcie_width) == ("slurm", 224, ("/scratch",), 16)
    assert (s.nvlink_links, s.nvlink_min_gbps, s.ib_max_link_downed) == (18, 26.0, 1)
    assert s.gpudirect and s.fabric_manager and s.gpu_process_ignore == ("nvvs",)
    assert HealthSpec().gpu_process_ignore == c.GPU_PROCESS_IGNORE and not HealthSpec().fabric_manager
    for bad, where in (("host: {cpus: many}", "host.cpus"), ("filesystems: [scratch]", "filesystems"),
                       ("fabric_manager: yes please", "fabric_manager"), ("nvlink: {lanes: 4}", "nvlink"),
                       ("gpu_processes: {ignore: nvvs}", "gpu_processes.ignore")):
        with pytest.raises(UserInputError) as e:
            load(bad, "h.yml")
        assert where in e.value.one_line(), (bad, e.value.one_line())


# ------------------------------------------------------------------ wired through check_node
class SiteNode:
    """A scripted node for the site checks: commands and files from text, Slurm's state in a fake client."""

    def __init__(self) -> None:
        self.files = {GRES: f"NodeName={NODE} Name=gpu Type=h100 File=/dev/fake/nvidia[0-7]\n",
                      "/proc/mounts": MOUNTS, collect.BOOT_ID: "boot-a\n", "/proc/meminfo": fx("meminfo-2tb.txt"),
                      "/proc/modules": fx("proc-modules-peermem.txt")}
        self.out = {collect.SMI_APPS: "", collect.SMI_PCIE: fx("query-pcie-h100x8-idle.txt"),
                    collect.SMI_NVLINK: fx("nvlink-status-h100x8.txt"), collect.ONLINE_CPUS: "224\n",
                    collect.FM_ACTIVE: "active\n", ("ibstat",): IBSTAT,
                    **perfquery("perfquery-port-1-down.txt")}
        self.unwritable: set[str] = set()
        self.hung: set[str] = set()           # a hung NFS server: the probe times out
        self.state, self.reason = "IDLE", ""
        self.ran: list[tuple] = []

    is_local = False

    def getenv(self, key):
        return None

    def run(self, argv, *, input=None, timeout=None, env=None):
        argv = tuple(argv)
        self.ran.append(argv)
        out, rc = "", 0
        if argv[0] == "stat":
            out = "".join(f"character special file|{f}\n" for f in argv[3:])
        elif argv[0] in ("munge", "unmunge"):
            out = "cred" if argv[0] == "munge" else "STATUS: Success (0)\n"
        elif argv == ("nvidia-smi", "-L"):
            out = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d}-1111-2222-3333-444444444444)\n"
                          for i in range(8))
        elif argv[0] == "mktemp":
            if argv[2] in self.hung:
                raise TransportError(f"command timed out after {timeout}s: mktemp")
            if argv[2] in self.unwritable:
                return CommandResult(argv, 1, "", f"mktemp: failed to create file via template "
                                                  f"'{argv[2]}/{argv[3]}': Read-only file system\n")
            out = f"{argv[2]}/.gpuhpc-health.abc123\n"
        elif argv[0] == "rm":
            pass
        elif argv in self.out:
            out = self.out[argv]
        else:
            rc = 127
        return CommandResult(argv, rc, out, "")

    def read_file(self, path):
        if path not in self.files:
            raise TransportError(f"cannot read {path}: No such file or directory")
        return self.files[path]

    def write_file(self, path, content, mode=0o644):
        self.files[path] = content

    def makedirs(self, path):
        pass

    def node(self, name):
        return NodeInfo(NODE, self.state, 224, 0, 2_000_000, 0, ("gpu",), reason=self.reason)

    def drain_node(self, name, reason):
        self.state, self.reason = "IDLE+DRAIN", f"{reason} [root@2026-12-02T21:00:00]"

    def resume_node(self, name):
        self.state, self.reason = "IDLE", ""

    def check(self, spec: HealthSpec, mode: str = "full"):
        return check_node(NODE, runner=self, client=self, spec=spec, mode=mode, apply=True, now=0.0)

    def status(self, out) -> dict[str, tuple[str, str]]:
        return {r.check: (r.status.value, r.message) for r in out.report.results}


FULL = HealthSpec(state_dir="/state", host_memory_mb="slurm", host_cpus="slurm", filesystems=("/scratch", "/shared"),
                  nvlink_links=18, ib_min_rate=None, ib_ports=4, gpudirect=True, fabric_manager=True)


def test_every_site_check_passes_on_a_healthy_node_and_a_bare_spec_skips_them():
    n = SiteNode()
    out = n.check(FULL)
    st = n.status(out)
    assert out.report.healthy, st
    for name in ("gpu-procs", "host", "filesystems", "pcie", "nvlink", "ib-errors", "nv-peermem", "fabric-manager"):
        assert st[name][0] == "ok", (name, st[name])
    # the fabric state came from the service (this scripted driver has no nvidia-smi -q): asked once
    assert ("nvidia-smi", "-q") in n.ran and collect.FM_ACTIVE in n.ran
    # no spec settings, no tools: every new check skips or passes, nothing drains
    bare = SiteNode()
    bare.out = {}
    out = bare.check(HealthSpec(state_dir="/state"))
    st = bare.status(out)
    assert out.report.healthy and out.decision.action.value == "none", st
    for name in ("gpu-procs", "host", "filesystems", "pcie", "nvlink", "ib-errors", "nv-peermem", "fabric-manager"):
        assert st[name][0] == "skip", (name, st[name])


@pytest.mark.parametrize("break_it, reason, returns", [
    (lambda n: n.out.__setitem__(collect.SMI_APPS, fx("query-compute-apps-leftover.txt")),
     "gpuhpc:dev: gpu processes left: 1002127 python, 1002311 python3.11", True),
    (lambda n: n.out.__setitem__(collect.ONLINE_CPUS, "223\n"), "gpuhpc:hw: host cpus 223/224", False),
    (lambda n: n.files.__setitem__("/proc/meminfo", fx("meminfo-2tb-dimm-lost.txt")),
     "gpuhpc:hw: host memory 1998243/2000000 MB", False),
    (lambda n: n.unwritable.add("/shared"),
     "gpuhpc:sw: fs /shared not writable (create: Read-only file system)", True),
    (lambda n: n.hung.add("/shared"), "gpuhpc:sw: fs /shared not writable (timed out)", True),
    (lambda n: n.files.__setitem__("/proc/mounts", MOUNTS.replace(" /shared ", " /elsewhere ")),
     "gpuhpc:sw: fs /shared not mounted", True),
    (lambda n: n.out.__setitem__(collect.SMI_PCIE, fx("query-pcie-h100x8-gpu2-x8.txt")), "gpuhpc:hw: pcie gpu2 x8/x16",
     False),
    (lambda n: n.out.__setitem__(collect.SMI_NVLINK, fx("nvlink-status-h100x8-gpu5-link7-inactive.txt")),
     "gpuhpc:hw: nvlink gpu5 link 7 inactive", False),
    (lambda n: n.out.update(perfquery("perfquery-port-flapped.txt")), "gpuhpc:dev: ib mlx5_1/1 link downed +3", True),
    (lambda n: n.files.__setitem__("/proc/modules", fx("proc-modules-no-peermem.txt")),
     "gpuhpc:sw: nv_peermem not loaded", True),
    (lambda n: n.out.__setitem__(collect.FM_ACTIVE, "inactive\n"), "gpuhpc:hw: fabric manager inactive", False),
], ids=["gpu-procs", "host-cpus", "host-memory", "fs-writable", "fs-hung", "fs-mounted", "pcie", "nvlink", "ib-errors",
        "nv-peermem", "fabric-manager"])
def test_a_broken_node_drains_naming_the_check_and_returns_by_its_class(break_it, reason, returns):
    n = SiteNode()
    assert n.check(FULL).report.healthy              # the first run also records the IB counters
    healthy = (dict(n.files), dict(n.out))
    break_it(n)
    out = n.check(FULL)
    assert out.decision.action.value == "drain" and out.applied, n.status(out)
    assert n.reason.startswith(reason + " ["), n.reason
    # fixed: a dev/sw drain returns on the next clean run; a hw drain sticks (admin or deep check)
    # (the state files stay, and IB counters never go back: a fixed link only stops adding to them)
    n.files = {**healthy[0], **{k: v for k, v in n.files.items() if k.startswith("/state")}}
    n.out = {**healthy[1], **{k: v for k, v in n.out.items() if k[0] == "perfquery"}}
    n.unwritable.clear()
    n.hung.clear()
    out = n.check(FULL)
    assert out.report.healthy, n.status(out)
    assert ("DRAIN" not in n.state) is returns, (n.state, n.reason, out.decision)


def test_gpu_processes_are_a_jobs_own_while_it_runs():
    n = SiteNode()
    n.out[collect.SMI_APPS] = fx("query-compute-apps-leftover.txt")
    n.state = "MIXED"
    out = n.check(FULL)
    assert out.report.healthy and n.status(out)["gpu-procs"][0] == "ok", n.status(out)


def test_a_look_without_apply_records_no_ib_counters():
    n = SiteNode()
    check_node(NODE, runner=n, client=n, spec=FULL, apply=False)
    assert "/state/ib-gpu-node1" not in n.files
    n.check(FULL)
    assert c.ib_counters_state(n.files["/state/ib-gpu-node1"], "boot-a")["mlx5_1/1"]["link_downed"] == 1


def test_host_against_slurm_needs_the_node_record():
    """``host: {cpus: slurm}`` with no Slurm record of the node (run_checks alone): skipped, not failed."""
    n = SiteNode()
    n.out[collect.ONLINE_CPUS] = "2\n"
    report = collect.run_checks(NODE, n, FULL, record=False)
    st = {r.check: r.status.value for r in report.results}
    assert st["host"] == "skip" and st["gpu-procs"] == "skip"


def test_ib_errors_skip_without_perfquery_and_count_only_infiniband_ports():
    n = SiteNode()
    n.out = {k: v for k, v in n.out.items() if k[0] != "perfquery"}
    out = n.check(FULL)
    assert out.report.healthy and n.status(out)["ib-errors"] == ("skip", "no perfquery on this node"), n.status(out)
    # an Ethernet (RoCE) port of the same HCA family is not asked
    n = SiteNode()
    n.out[("ibstat",)] = IBSTAT + ("CA 'mlx5_2'\n\tPort 1:\n\t\tState: Active\n\t\tRate: 200\n"
                                   "\t\tLink layer: Ethernet\n")
    n.check(FULL)
    assert not any(a[:3] == ("perfquery", "-C", "mlx5_2") for a in n.ran)
