"""What systemd made of node_exporter's IP filter (tasks/main.yml runs it on the host with the host's python3).

stdin: {"service": unit name, "allowed": what the role wrote to IPAddressAllow= besides localhost}.
stdout: {"deny_all", "allow_as_written", "enforced", "shown"} as JSON. systemctl show lists the prefixes systemd
loaded (IPAddressDeny=any as 0.0.0.0/0 ::/0; localhost as 127.0.0.0/8 ::1/128), and may merge one that another
covers, so the lists are compared as sets of addresses, not as text. IPIngressBytes is a number only where systemd
attached its BPF program to the service's cgroup; "[no data]" where the kernel cannot (the filter is then not
applied, though the unit starts: systemd's bpf-firewall.c, "proceeding without").
"""

import ipaddress
import json
import subprocess
import sys


def covered(networks, others):
    """Whether every network of `networks` lies within one of `others`."""
    return all(any(n.version == o.version and n.subnet_of(o) for o in others) for n in networks)


def main():
    asked = json.load(sys.stdin)
    shown = subprocess.run(
        ["systemctl", "show", "--property=IPAddressDeny,IPAddressAllow,IPIngressBytes", asked["service"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    values = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    deny = [ipaddress.ip_network(word, strict=False) for word in values.get("IPAddressDeny", "").split()]
    allow = [ipaddress.ip_network(word, strict=False) for word in values.get("IPAddressAllow", "").split()]
    written = [ipaddress.ip_network(word, strict=False) for word in ["127.0.0.0/8", "::1/128"] + asked["allowed"]]
    every = [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
    json.dump(
        {
            "deny_all": covered(every, deny),
            "allow_as_written": covered(written, allow) and covered(allow, written),
            "enforced": values.get("IPIngressBytes", "").isdigit(),
            "shown": {key: values.get(key, "") for key in ("IPAddressDeny", "IPAddressAllow", "IPIngressBytes")},
        },
        sys.stdout,
    )


main()
