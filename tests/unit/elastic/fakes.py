"""Stand-ins for the elastic unit tests: a recording :class:`gpuhpc.slurm.power.PowerSlurm` (the
worker's and the reconciler's side of Slurm: answers ``nodes`` from a list, records every change
it is asked for in ``calls``), and one moto EC2 account (:func:`moto_ec2`)."""
from __future__ import annotations

from contextlib import contextmanager


class RecordingSlurm:
    def __init__(self, nodes=()):
        self.node_list, self.calls = list(nodes), []

    def nodes(self, names=None):
        return self.node_list

    def down(self, nodes, reason):
        self.calls.append(("down", nodes, reason))
        return True

    def resume(self, nodes):
        self.calls.append(("resume", nodes))
        return True

    def power_down(self, nodes, force=True):
        self.calls.append(("power_down", nodes))
        return True

    def update(self, node, **fields):
        self.calls.append(("update", node, fields))
        return True


@contextmanager
def moto_ec2():
    """moto's in-process EC2 with the launch template ``gpuhpc-node``: yields (client, AMI id).
    Its set-up costs seconds: a test module opens one and makes each test its own cluster."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("ec2", region_name="us-east-1")
        ami = client.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
        client.create_launch_template(LaunchTemplateName="gpuhpc-node", LaunchTemplateData={"ImageId": ami})
        yield client, ami
