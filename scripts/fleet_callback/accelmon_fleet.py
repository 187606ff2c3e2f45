"""An Ansible callback (scripts/deploy_fleet.py enables it for each of its ansible-playbook runs): at the end of the
run it writes to $ACCELMON_FLEET_SUMMARY what the run did to its hosts, whatever the stdout callback prints.

    {"stopped": bool, "failed": [host, ...], "unreachable": [host, ...], "hosts": [host, ...]}

`stopped`: a batch ran out of hosts, or had more failed hosts than the play's max_fail_percentage, so the play was
cut short (Ansible's "NO MORE HOSTS LEFT", v2_playbook_on_no_hosts_remaining: ansible-core's linear strategy
sends it in both cases); the hosts of later batches were not deployed. A run that failed hosts within its budget
has `failed` but is not stopped. `ansible-playbook`'s exit status says neither apart: 2 in both.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: accelmon_fleet
    type: aggregate
    short_description: what a run did to its hosts, as JSON, for scripts/deploy_fleet.py
    description: Writes $ACCELMON_FLEET_SUMMARY at the end of the run.
    requirements: [enabled through callbacks_enabled]
"""


class CallbackModule(CallbackBase):  # type: ignore[misc]
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "accelmon_fleet"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    def v2_playbook_on_no_hosts_remaining(self) -> None:
        self.stopped = True

    def v2_playbook_on_stats(self, stats: Any) -> None:
        path = os.environ.get("ACCELMON_FLEET_SUMMARY")
        if not path:
            return
        hosts = sorted(stats.processed)
        summary = {
            "stopped": self.stopped,
            "failed": [host for host in hosts if stats.summarize(host)["failures"]],
            "unreachable": [host for host in hosts if stats.summarize(host)["unreachable"]],
            "hosts": hosts,
        }
        with open(path, "w", encoding="utf-8") as out:
            json.dump(summary, out)
