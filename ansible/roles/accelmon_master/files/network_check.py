"""Whether accelmon_master_network_subnet can be the master's container network (tasks/network.yml runs it on the
master with the host's python3; the standard library only).

stdin: {"subnet": the variable, "network": accelmon_master_network, "names": the inventory's hosts, "hosts": their
ansible_host ("" for none)}.
stdout: {"problems": [sentence, ...]} as JSON, empty when the subnet will do.

The subnet must be an IPv4 network written as one (10.89.254.0/24: host bits under the prefix are a typo, not a
network; podman and docker want it so), with room for the gateway and the three containers (/29 or wider), and not
so wide it would shadow a large part of the address space (/8 or narrower). It must overlap none of the host's own
IPv4 networks (as `ip -j -4 addr show` lists them), except the bridge of accelmon_master_network itself on this
very subnet that an earlier deploy made (its gateway the subnet's first address; its interface as `podman network
inspect` or `docker network inspect` names it, as root): the host would route that traffic into the bridge. Any
other bridge on it is another network's (another project's docker network, say): its containers would be let in by
a co-located worker's exporters, and the engine would refuse to make the master's network after the workers had
been changed. podman
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


def problems(subnet_text, addresses, interfaces, routes=(), bridges=()):
    """The reasons `subnet_text` will not do; `interfaces` is `ip -j -4 addr show`'s list, `routes` `ip -j -4 route
    show table all`'s, `bridges` the interface names of the master's own network (own_bridges)."""
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
            if held.network == subnet and held.ip == gateway and interface.get("ifname") in bridges:
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


def own_bridges(network):
    """The host interfaces of the engines' network named `network` (none where it is not made yet): podman 4's
    network_interface, podman 3's CNI bridge plugin's bridge, docker's bridge name option or br- and its id's first
    12 characters (docker's bridge driver names it so)."""
    names = set()
    for engine in ("podman", "docker"):
        try:
            inspected = subprocess.run([engine, "network", "inspect", network], capture_output=True, timeout=60)
            listed = json.loads(inspected.stdout.decode() or "[]") if inspected.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired, ValueError):
            continue  # no such engine, or no answer: its bridge is not excepted
        for found in listed if isinstance(listed, list) else []:
            names.add(found.get("network_interface"))
            names.update(plugin.get("bridge") for plugin in found.get("plugins") or [])
            if found.get("Driver") == "bridge":
                options = found.get("Options") or {}
                names.add(options.get("com.docker.network.bridge.name") or "br-" + str(found.get("Id", ""))[:12])
    names.discard(None)
    return names


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
        found = problems(asked["subnet"], addresses, interfaces, routes, own_bridges(asked["network"]))
    json.dump({"problems": found}, sys.stdout)


if __name__ == "__main__":
    main()
