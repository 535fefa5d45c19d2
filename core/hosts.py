"""How ranks find each other without host names: this host's addresses, and the
identity of its network stack. The watchdog's heartbeats and collect mode's log
lines use them; names do not tell hosts apart (cloned VMs and containers started
with one --hostname share theirs) and may resolve nowhere, or to 127.0.1.1."""
import os
import socket

LOOPBACK = "127.0.0.1"


def local_addresses():
    """This host's IPv4 addresses other than loopback."""
    import psutil  # a dependency of Horovod
    found = []
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                found.append(address.address)
    return found


def machine_identity():
    """What two ranks share exactly when they share a network stack: this boot of
    this kernel and this network namespace. Host names do not tell: cloned VMs
    and containers started with one --hostname share theirs."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:  # no /proc: only loopback-free addresses are trusted
        return None


def addresses_to_reach(machine, addresses):
    """Where a peer that listens on every interface and gave its machine_identity()
    and local_addresses() is reached from here: over loopback alone when it shares
    this network stack (its addresses may be none but loopback's), at each of its
    addresses otherwise (loopback there is this machine's own)."""
    if machine is not None and machine == machine_identity():
        return [LOOPBACK]
    return list(addresses)
