"""Whether accelmon_master_network_subnet can be the master's container network (tasks/network.yml runs it on the
master with the host's python3; the standard library only).

stdin: {"subnet": the variable, "names": the inventory's hosts, "hosts": their ansible_host ("" for none)}.
stdout: {"problems": [sentence, ...]} as JSON, empty when the subnet will do.

The subnet must be an IPv4 network written as one (10.89.254.0/24: host bits under the prefix are a typo, not a
network; podman and docker want it so), with room for the gateway and the three containers (/29 or wider), and not
so wide it would shadow a large part of the address space (/8 or narrower). It must overlap none of the host's own
IPv4 networks (as `ip -j -4 addr show` lists them), except the engine's bridge for this very subnet that an earlier
deploy made (its gateway is the subnet's first address): the host would route that traffic into the bridge. podman
refuses such a subnet when it creates the network; docker takes it and the host loses that network. Nor may it
overlap a network the host reaches through a router (`ip -j -4 route show table all`, its routes other than the
default and the kernel's own for its addresses): the bridge's route is more specific, so the site's hosts there
would become unreachable from the master, where the engine takes the subnet (a given one is not checked against
routes by every engine). Nor may it hold an inventory host's address given as an IP: Prometheus would send that
host's scrapes into its own bridge.
"""

import ipaddress
import json
import subprocess
import sys


def problems(subnet_text, addresses, interfaces, routes=()):
    """The reasons `subnet_text` will not do; `interfaces` is `ip -j -4 addr show`'s list, `routes` `ip -j -4 route
    show table all`'s."""
    name = "accelmon_master_network_subnet=" + str(subnet_text)
    try:
        subnet = ipaddress.IPv4Network(str(subnet_text))
    except ValueError as error:
        return [name + " is no IPv4 network such as 10.89.254.0/24 (" + str(error) + ")"]
    found = []
    if not 8 <= subnet.prefixlen <= 29:
        found.append(name + ": the prefix must be /8 to /29 (room for the gateway and three containers)")
    if subnet.is_loopback or subnet.is_link_local or subnet.is_multicast or subnet.is_reserved:
        found.append(name + " is a loopback, link-local, multicast or reserved range")
    gateway = subnet.network_address + 1
    for interface in interfaces:
        for info in interface.get("addr_info", []):
            if info.get("family") != "inet":
                continue
            held = ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}")
            if held.network == subnet and held.ip == gateway:
                continue  # the bridge an earlier deploy made for this subnet
            if held.network.overlaps(subnet):
                where = interface.get("ifname", "?")
                found.append(
                    f"{name} overlaps {held.with_prefixlen} on this host's interface {where}: choose a free network"
                )
    for route in routes:
        # The default route overlaps everything; the kernel's own routes are the interfaces' networks, checked above.
        destination = route.get("dst", "default")
        if destination == "default" or route.get("protocol") == "kernel":
            continue
        try:
            reached = ipaddress.IPv4Network(destination, strict=False)
        except ValueError:
            continue  # not an IPv4 destination
        if reached.prefixlen and reached.overlaps(subnet):
            via = " via " + route["gateway"] if route.get("gateway") else ""
            found.append(
                f"{name} overlaps the route to {reached.with_prefixlen}{via} on this host"
                f" ({route.get('dev', '?')}): the bridge would take that network's traffic; choose a free network"
            )
    inside = []
    for host, address in sorted(addresses.items()):
        try:
            if ipaddress.ip_address(str(address).strip("[]")) in subnet:
                inside.append(f"{host} ({address})")
        except ValueError:
            continue  # a name: the inventory gives no address to compare
    if inside:
        found.append(
            f"{name} holds the address of {', '.join(inside)}: Prometheus would reach it into its own bridge;"
            " choose a free network"
        )
    return found


def main():
    asked = json.load(sys.stdin)
    try:
        listed = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, check=True).stdout
        interfaces = json.loads(listed.decode() or "[]")
        command = ["ip", "-j", "-4", "route", "show", "table", "all"]
        routes = json.loads(subprocess.run(command, capture_output=True, check=True).stdout.decode() or "[]")
    except (OSError, subprocess.CalledProcessError, ValueError) as error:
        found = ["the host's networks could not be read to check accelmon_master_network_subnet against them "
                 "(`ip -j -4 addr show`, `ip -j -4 route show table all`, iproute2): " + str(error)]  # fmt: skip
    else:
        # A host without ansible_host is reached by its inventory name, which may be an address too.
        addresses = {name: host or name for name, host in zip(asked["names"], asked["hosts"])}
        found = problems(asked["subnet"], addresses, interfaces, routes)
    json.dump({"problems": found}, sys.stdout)


if __name__ == "__main__":
    main()
