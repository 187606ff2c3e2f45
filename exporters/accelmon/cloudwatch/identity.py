"""The instance's identity by IMDSv2, for the instance dimensions."""

from __future__ import annotations

import logging
import urllib.request

log = logging.getLogger("accelmon.cloudwatch")


def instance_identity(endpoint: str, timeout: float) -> dict[str, str]:
    """InstanceId, InstanceType, Region and AutoScalingGroupName (when the instance's tags are in IMDS) by IMDSv2:
    a session token first (PUT), then the reads. {} off EC2 or when IMDS does not answer within `timeout`."""
    base = endpoint.rstrip("/")
    try:
        request = urllib.request.Request(
            f"{base}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            token = response.read().decode()
    except (OSError, ValueError) as error:
        log.info("no instance metadata (IMDSv2 at %s: %s): publishing without instance dimensions", base, error)
        return {}

    def read(path: str) -> str:
        request = urllib.request.Request(f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read().decode().strip()
        except (OSError, ValueError):
            return ""  # a 404 (tags not exposed to IMDS) or a timeout: that item is unknown

    identity = {
        "InstanceId": read("instance-id"),
        "InstanceType": read("instance-type"),
        "Region": read("placement/region"),
        "AutoScalingGroupName": read("tags/instance/aws:autoscaling:groupName"),
    }
    return {key: value for key, value in identity.items() if value}
