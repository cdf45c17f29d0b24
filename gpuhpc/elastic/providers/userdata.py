"""Nodes that come up by themselves (docs/elastic.md, "Nodes that come up by themselves"): the user
data a pool's launch template carries, and the IAM policies the controller and the nodes need.

The user data (a shell script cloud-init runs once at first boot) holds no secret: it asks the
instance metadata service (IMDSv2: a session token first; the template requires tokens and a hop
limit of 1, so a container on the node cannot reach the instance role) for the region and for the
``gpuhpc:node`` tag (the node's Slurm name: given at launch, or by CreateTags right after a fleet;
the template turns tags in the metadata on), fetches the munge key from SSM Parameter Store through
the instance role (a SecureString holding the key in base64; never in the image or the user data),
starts munge, a configless ``slurmd --conf-server CONTROLLERS -N NAME`` and, where the image has
gpuhpc, the spot notice watcher (:mod:`gpuhpc.elastic.spotwatch`). Every value is
validated here and quoted (``shlex.quote``) where it enters the script.

Pure: text and dicts out; the EC2 provider (:mod:`gpuhpc.elastic.providers.ec2`) puts them in the
launch template and the key into SSM."""
from __future__ import annotations

import json
import re
import shlex

from gpuhpc.elastic.providers.base import TAG_CLUSTER, TAG_NODE
from gpuhpc.errors import UserInputError

IMDS = "http://169.254.169.254"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(?::[0-9]{1,5})?"
_CONTROLLERS = re.compile(rf"{_HOST}(?:,{_HOST})*")
_PARAMETER = re.compile(r"/?[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")      # SSM's own name alphabet
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_PATH = re.compile(r"/[A-Za-z0-9_./-]+")


def munge_parameter(cluster: str) -> str:
    """The default SSM parameter of a cluster's munge key."""
    return f"/gpuhpc/{cluster}/munge-key"


def _check(value: str, pattern: re.Pattern, field: str, hint: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UserInputError(f"{field}: {value!r} is not valid", field=field, hint=hint)
    return value


def user_data(*, cluster: str, pool: str, controllers: str, parameter: str, slurmd: str = "/usr/sbin/slurmd",
              tag_wait: int = 300) -> str:
    """The first-boot script of a pool's instances. ``controllers``: the conf servers (``host`` or
    ``host:port``, comma-separated for two controllers); ``parameter``: the SSM parameter with the
    munge key (base64); ``tag_wait``: seconds to wait for the node tag (a fleet's node tags are
    added just after it)."""
    _check(cluster, _NAME, "cluster_name", "letters, digits, '.', '_', '-'")
    _check(pool, _NAME, "node_groups[].name", "letters, digits, '.', '_', '-'")
    _check(controllers, _CONTROLLERS, "providers.aws.controllers",
           "host names or host:port, comma-separated (the SlurmctldHost names)")
    _check(parameter, _PARAMETER, "providers.aws.munge_parameter", "an SSM parameter name such as /gpuhpc/c1/munge-key")
    _check(slurmd, _PATH, "providers.aws.slurmd", "an absolute path")
    if not 10 <= int(tag_wait) <= 3600:
        raise UserInputError(f"providers.aws.tag_wait: {tag_wait} is out of range", field="providers.aws.tag_wait",
                             hint="10 to 3600 seconds")
    q = shlex.quote
    tries = int(tag_wait) // 2
    return f"""#!/bin/bash
# gpuhpc node bootstrap: cluster {cluster}, pool {pool} (gpuhpc.elastic.providers.userdata). It holds no
# secret: the munge key comes from SSM Parameter Store through the instance role.
set -euo pipefail
umask 077
CLUSTER={q(cluster)}
CONTROLLERS={q(controllers)}
PARAMETER={q(parameter)}
SLURMD={q(slurmd)}
IMDS={q(IMDS)}
TOKEN=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 21600' "$IMDS/latest/api/token")
imds() {{ curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" "$IMDS/latest/meta-data/$1"; }}
REGION=$(imds placement/region)
# the node's Slurm name: its {TAG_NODE} tag (at launch, or just after its fleet)
NODE=""
for _ in $(seq 1 {tries}); do
  NODE=$(imds {q('tags/instance/' + TAG_NODE)} || true)
  [ -n "$NODE" ] && break
  sleep 2
done
if ! [[ "$NODE" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
  echo "gpuhpc: no valid {TAG_NODE} tag on this instance" >&2
  exit 1
fi
[ "$(imds {q('tags/instance/' + TAG_CLUSTER)} || true)" = "$CLUSTER" ] || {{ echo "gpuhpc: not a $CLUSTER instance" >&2; exit 1; }}
# the munge key, through the instance role; written 0400 munge:munge, never logged
install -d -o munge -g munge -m 0700 /etc/munge
aws ssm get-parameter --region "$REGION" --with-decryption --name "$PARAMETER" \\
    --query Parameter.Value --output text | base64 -d > /etc/munge/munge.key.new
chown munge:munge /etc/munge/munge.key.new
chmod 0400 /etc/munge/munge.key.new
mv -f /etc/munge/munge.key.new /etc/munge/munge.key
systemctl restart munge
# slurmd, configless: slurm.conf and the rest come from the controller
OPTIONS="--conf-server $CONTROLLERS -N $NODE"
for f in /etc/default/slurmd /etc/sysconfig/slurmd; do
  if [ -d "$(dirname "$f")" ]; then printf 'SLURMD_OPTIONS="%s"\\n' "$OPTIONS" > "$f"; fi
done
if systemctl cat slurmd >/dev/null 2>&1; then
  systemctl restart slurmd
else
  "$SLURMD" --conf-server "$CONTROLLERS" -N "$NODE"
fi
# the spot notice watcher (gpuhpc.elastic.spotwatch), where the image has gpuhpc
if python3 -c 'import gpuhpc.elastic.spotwatch' >/dev/null 2>&1; then
  systemd-run --unit=gpuhpc-spotwatch --property=Restart=always \
      python3 -m gpuhpc.elastic.spotwatch --node "$NODE"
fi
"""


METADATA_OPTIONS = {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled",
                    "InstanceMetadataTags": "enabled"}


def controller_policy(*, cluster: str, region: str = "REGION", account: str = "ACCOUNT",
                      instance_role: str = "gpuhpc-node") -> dict:
    """What ``gpuhpc power`` on a controller needs (the role or user it runs as): launch only
    instances tagged with the cluster, tag only them (and only with the node tag after launch),
    end only them, pass only the nodes' role."""
    arn = f"arn:aws:ec2:{region}:{account}"
    owned = {"StringEquals": {f"aws:ResourceTag/{TAG_CLUSTER}": cluster}}
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "LaunchTaggedInstances", "Effect": "Allow", "Action": ["ec2:CreateFleet", "ec2:RunInstances"],
         "Resource": [f"{arn}:instance/*", f"{arn}:volume/*", f"{arn}:network-interface/*"],
         "Condition": {"StringEquals": {f"aws:RequestTag/{TAG_CLUSTER}": cluster}}},
        {"Sid": "LaunchFrom", "Effect": "Allow", "Action": ["ec2:CreateFleet", "ec2:RunInstances"],
         "Resource": [f"{arn}:fleet/*", f"{arn}:launch-template/*", f"{arn}:subnet/*", f"{arn}:security-group/*",
                      f"{arn}:placement-group/*", f"{arn}:capacity-reservation/*",
                      f"arn:aws:ec2:{region}::image/*", f"{arn}:image/*"]},
        {"Sid": "TagAtLaunch", "Effect": "Allow", "Action": "ec2:CreateTags",
         "Resource": [f"{arn}:instance/*", f"{arn}:volume/*", f"{arn}:network-interface/*", f"{arn}:fleet/*"],
         "Condition": {"StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"]}}},
        {"Sid": "NameOwnInstances", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": f"{arn}:instance/*",
         "Condition": {**owned, "ForAllValues:StringEquals": {"aws:TagKeys": [TAG_NODE]}}},
        {"Sid": "EndOwnInstances", "Effect": "Allow", "Action": "ec2:TerminateInstances",
         "Resource": f"{arn}:instance/*", "Condition": owned},
        {"Sid": "Read", "Effect": "Allow", "Resource": "*", "Action": [
            "ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeSpotInstanceRequests",
            "ec2:DescribeSpotPriceHistory",
            "ec2:DescribeLaunchTemplates", "ec2:DescribeLaunchTemplateVersions", "ec2:DescribePlacementGroups"]},
        {"Sid": "PassNodeRole", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": f"arn:aws:iam::{account}:role/{instance_role}",
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
    ]}


def node_policy(*, cluster: str, region: str = "REGION", account: str = "ACCOUNT",
                parameter: str | None = None) -> dict:
    """The nodes' instance role: read the one munge-key parameter, nothing else."""
    name = (parameter or munge_parameter(cluster)).lstrip("/")
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "MungeKey", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:aws:ssm:{region}:{account}:parameter/{name}"}]}


def setup_policy(*, cluster: str, region: str = "REGION", account: str = "ACCOUNT",
                 parameter: str | None = None, instance_role: str = "gpuhpc-node") -> dict:
    """Once, by an administrator (``gpuhpc.elastic.providers.ec2.setup``): the pools' launch
    templates and placement groups, and the munge key into SSM."""
    name = (parameter or munge_parameter(cluster)).lstrip("/")
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "Templates", "Effect": "Allow", "Resource": "*", "Action": [
            "ec2:CreateLaunchTemplate", "ec2:CreateLaunchTemplateVersion", "ec2:ModifyLaunchTemplate",
            "ec2:CreatePlacementGroup", "ec2:CreateTags", "ec2:DescribeLaunchTemplates",
            "ec2:DescribeLaunchTemplateVersions", "ec2:DescribePlacementGroups"]},
        {"Sid": "PutMungeKey", "Effect": "Allow", "Action": "ssm:PutParameter",
         "Resource": f"arn:aws:ssm:{region}:{account}:parameter/{name}"},
        {"Sid": "TemplatesPassNodeRole", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": f"arn:aws:iam::{account}:role/{instance_role}",
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
    ]}


def policies_json(cluster: str = "CLUSTER") -> str:
    """The three policies as docs/elastic.md publishes them (a unit test keeps the page in step)."""
    return json.dumps({"controller": controller_policy(cluster=cluster), "node": node_policy(cluster=cluster),
                       "setup": setup_policy(cluster=cluster)}, indent=2)
