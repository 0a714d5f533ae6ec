"""What the tests that build network namespaces share: running commands
(in a namespace), turning a veth's checksum offload off, and reading one
Prometheus sample."""

import re
import subprocess


def sh(*cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout


def in_ns(name, *cmd, check=True):
    return sh("ip", "netns", "exec", name, *cmd, check=check)


def offload_off(name, dev):
    # Packets leaving a veth with checksum offload carry a partial checksum
    # the receiving kernel would trust; through AF_XDP it must be whole.
    in_ns(name, "ethtool", "-K", dev, "tx", "off", check=False)


def metric(text, name, **labels):
    """The value of series `name` with exactly `labels` in an exposition."""
    if labels:
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = rf"^{name}\{{{re.escape(want)}\}} (\S+)$"
    else:
        pattern = rf"^{name} (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else None


def router_and_lan(names, lan, hosts, client):
    """The namespaces `names` (key -> name) made, with `r` a router between
    a bridged LAN `lan`.0/24 (the router .1) with each of `hosts` (key ->
    (device, address)) on it, and the client `c` on `client`.0/24 (client
    .10, router .1, its default route). Checksum offload off everywhere:
    frames go through AF_XDP."""
    for n in names.values():
        sh("ip", "netns", "add", n)
    for n in names.values():
        sh("ip", "-n", n, "link", "set", "lo", "up")
    r = names["r"]
    sh("ip", "-n", r, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", r, "addr", "add", f"{lan}.1/24", "dev", "br0")
    sh("ip", "-n", r, "link", "set", "br0", "up")
    offload_off(r, "br0")
    for k, (dev, addr) in hosts.items():
        port = f"p{k}"
        sh("ip", "-n", r, "link", "add", port, "type", "veth", "peer", "name", dev, "netns", names[k])
        sh("ip", "-n", r, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", names[k], "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "-n", names[k], "link", "set", dev, "up")
        offload_off(r, port)
        offload_off(names[k], dev)
    c = names["c"]
    sh("ip", "-n", r, "link", "add", "rc", "type", "veth", "peer", "name", "c0", "netns", c)
    sh("ip", "-n", r, "addr", "add", f"{client}.1/24", "dev", "rc")
    sh("ip", "-n", r, "link", "set", "rc", "up")
    sh("ip", "-n", c, "addr", "add", f"{client}.10/24", "dev", "c0")
    sh("ip", "-n", c, "link", "set", "c0", "up")
    sh("ip", "-n", c, "route", "add", "default", "via", f"{client}.1")
    offload_off(r, "rc")
    offload_off(c, "c0")
    in_ns(r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
