"""``gpuhpc topology audit``: cabling faults of the real NDR dump, none on clean synthetic fabrics."""
from collections import Counter

import pytest

from gpuhpc.topology.audit import audit
from gpuhpc.topology.fabric import analyse
from gpuhpc.topology.ibnetdiscover import parse
from gpuhpc.topology.synth import synth


@pytest.fixture(scope="module")
def ndr_findings(ndr_path):
    return audit(analyse(parse(ndr_path.read_text(), str(ndr_path))))


@pytest.mark.parametrize("kw", [{}, {"rails": 4}, {"levels": 3, "leaves": 16, "rails": 2}, {"hosts_per_leaf": 1}])
def test_clean_synthetic_fabric_has_no_finding(kw):
    assert audit(analyse(parse(synth(**kw), "synth"))) == []


def test_degraded_host_links_name_both_ports():
    found = audit(analyse(parse(synth(degraded=2, rails=2), "synth")))
    assert [f.kind for f in found] == ["degraded", "degraded"]
    assert found[0].ports == ("gpu001 mlx5_0 port 1", "switch r0-leaf001 port 1")
    assert "2xNDR" in found[0].message and "4xNDR" in found[0].message


def test_ndr_dump_hosts_cabled_against_their_rails(ndr_findings):
    rail = [f for f in ndr_findings if f.kind == "rail"]
    # B09-P1-IBLEAF-03-08 (rail 2) and -04-08 (rail 3) hold HCAs of other rails: counted by hand
    assert {(f.ports[0], f.ports[1]) for f in rail} == {
        ("host B11-P1-CUFM-02 mlx5_0", "switch B09-P1-IBLEAF-03-08 port 22"),
        ("host B11-P1-CUFM-02 mlx5_1", "switch B09-P1-IBLEAF-04-08 port 22"),
        ("host ubuntu mlx5_0", "switch B09-P1-IBLEAF-03-08 port 21"),
        ("host ubuntu mlx5_1", "switch B09-P1-IBLEAF-04-08 port 21"),
        ("host b08-p1-dgx-08-c01 HCA-5", "switch B09-P1-IBLEAF-04-08 port 1"),
        ("host b08-p1-dgx-08-c01 HCA-6", "switch B09-P1-IBLEAF-03-08 port 1"),
    }


def test_ndr_dump_has_no_degraded_link_and_reports_missing_uplinks(ndr_findings):
    kinds = Counter(f.kind for f in ndr_findings)
    assert kinds["degraded"] == 0            # every one of the 1114 cables is 4xNDR
    msgs = [f.message for f in ndr_findings if f.kind == "missing"]
    assert any("A09-P1-IBLEAF-04-02 has 8 uplink" in m and "A10-P1-IBSPINE-01" in m for m in msgs)
    pair = next(f for f in ndr_findings if "A09-P1-IBLEAF-01-01 <-> switch A10-P1-IBSPINE-04" in f.message)
    assert pair.ports == ("switch A09-P1-IBLEAF-01-01 port 39 <-> switch A10-P1-IBSPINE-04 port 1",)


def test_duplicated_hca_and_extra_uplink_cable():
    text = synth(rails=1, leaves=2, hosts_per_leaf=2)
    # the same NodeDesc on two CAs: gpu002's HCA renamed to gpu001's
    text = text.replace('"gpu002 mlx5_0"', '"gpu001 mlx5_0"')
    found = audit(analyse(parse(text, "synth")))
    dup = [f for f in found if f.kind == "duplicated"]
    assert len(dup) == 1 and dup[0].ports == ("switch r0-leaf001 port 1", "switch r0-leaf001 port 2")


def test_cli_audit_json_and_check(cli, ndr_path, tmp_path):
    rc, out, err = cli("topology", "audit", str(ndr_path), "--json")
    assert rc == 0 and '"kind": "rail"' in out and "finding(s)" in err
    clean = tmp_path / "clean.out"
    clean.write_text(synth(rails=2))
    rc, out, err = cli("topology", "audit", str(clean), "--check")
    assert (rc, out) == (0, "") and "0 finding(s)" in err
    bad = tmp_path / "bad.out"
    bad.write_text(synth(degraded=1))
    rc, out, _ = cli("topology", "audit", str(bad), "--check")
    assert rc == 1 and out.startswith("degraded")
