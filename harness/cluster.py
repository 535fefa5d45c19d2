"""Hosts made of Linux network namespaces, for multi-host tests on one machine.

    switch namespace: bridge br0
       |-- veth -- host1 namespace: eth0 10.213.0.1, sshd, hostname host1
       |-- veth -- host2 namespace: eth0 10.213.0.2, sshd, hostname host2

Each host runs a real OpenSSH server on its own address, in a UTS namespace
of its own with its own host name (the same name on every host, with
`names`, as cloned VMs have), an /etc/hosts naming every host (`ip netns
exec` bind-mounts /etc/netns/NS/hosts over it; with `loopback_name`, each
host's own name maps to 127.0.1.1 there, as Debian's installer writes it)
and its own Open MPI session
directory (sshd's SetEnv). mpirun's and horovodrun's own ssh launchers start
the remote ranks through OpenSSH's client. The cluster's key and client
options come in through `ssh` first on PATH, which runs /usr/bin/ssh with the
cluster's config file (-F), so root's own ~/.ssh is never touched; as on real
hosts, that config sets no keepalive.

Faults: `cut` takes a host's port off the bridge (its carrier stays up, so the
host notices nothing: the silence of a failed switch), `partition` splits the
hosts into groups that reach only each other, `vanish` cuts a host and
SIGKILLs every process in it, `cap` puts a tbf rate limit on every host's
egress. `close` kills every process in the namespaces and removes them.
"""
import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid

from harness.launch import Launch, describe, kill_until_gone

SUBNET = "10.213.0"
PREFIX = "lmt"
TOKEN_LEN = 4
# One file per live cluster, named by its token, holding the pid that made it.
OWNERS = "/run/lm_ptb_clusters"
TOOLS = {"ip": "iproute2", "tc": "iproute2", "unshare": "util-linux", "/usr/sbin/sshd": "openssh-server",
         "/usr/bin/ssh": "openssh-client", "ssh-keygen": "openssh-client"}

SSHD_CONFIG = """ListenAddress {address}
HostKey {ssh}/host_key
PidFile {ssh}/sshd.{host}.pid
AuthorizedKeysFile {ssh}/authorized_keys
# The key files live under /tmp, which StrictModes would refuse.
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
LogLevel ERROR
SetEnv OMPI_MCA_orte_tmpdir_base={workdir}/{host}
# A session whose client is cut off ends after 3 unanswered probes; without
# them it would wait for TCP's own keepalive, two hours by default.
ClientAliveInterval 3
ClientAliveCountMax 3
"""

SSH_CONFIG = """Host *
  User root
  IdentityFile {ssh}/id_ed25519
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
"""

SSH = """#!/bin/sh
# OpenSSH's own client, with the test cluster's key and host options.
exec /usr/bin/ssh -F {ssh}/config "$@"
"""


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def missing_tools():
    """The Debian packages that namespace hosts need and this machine lacks."""
    return sorted({package for tool, package in TOOLS.items() if not shutil.which(tool)})


def _owner_alive(token):
    """Whether the process that made cluster `token` still runs. Clusters of
    test processes running side by side (pytest -n) are left alone."""
    try:
        with open(os.path.join(OWNERS, token)) as f:
            os.kill(int(f.read()), 0)
    except (OSError, ValueError):
        return False
    return True


def remove_stale():
    """Removes the namespaces of clusters whose test process died before its cleanup."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX) and not _owner_alive(name[len(PREFIX):len(PREFIX) + TOKEN_LEN]):
            _kill_namespace(name)
            _ip("netns", "delete", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
    # Records of dead owners whose namespaces are already gone.
    for token in os.listdir(OWNERS) if os.path.isdir(OWNERS) else ():
        if not _owner_alive(token):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(OWNERS, token))


def _namespace_pids(name):
    out = _ip("netns", "pids", name, check=False).stdout
    return [int(pid) for pid in out.split() if pid.isdigit()]


def _kill_namespace(name):
    kill_until_gone(lambda: _namespace_pids(name))


class Cluster:
    """`hosts` namespace hosts, host1, host2, ...; `names` gives their UTS host names
    (by default their own)."""

    def __init__(self, hosts, workdir, names=None, loopback_name=False):
        self.token = uuid.uuid4().hex[:TOKEN_LEN]
        os.makedirs(OWNERS, exist_ok=True)
        with open(os.path.join(OWNERS, self.token), "w") as f:
            f.write(str(os.getpid()))
        self.hosts = [f"host{i + 1}" for i in range(hosts)]
        self.names = dict(zip(self.hosts, names or self.hosts))
        self.loopback_name = loopback_name
        self.workdir = str(workdir)
        self.switch = f"{PREFIX}{self.token}sw"
        self.namespaces = {host: f"{PREFIX}{self.token}{host}" for host in self.hosts}
        self.addresses = {host: f"{SUBNET}.{i + 1}" for i, host in enumerate(self.hosts)}
        self.ports = {host: f"{PREFIX}{self.token}p{i + 1}" for i, host in enumerate(self.hosts)}
        self.bin = os.path.join(self.workdir, "bin")
        self.ssh = os.path.join(self.workdir, "ssh")
        self.sshd = {}  # host -> its listening sshd (a Popen)
        self.launches = []
        try:
            self._build()
            self._start_ssh()
        except BaseException:
            self.close()
            raise

    def _build(self):
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            own = f"127.0.1.1 {self.names[host]}\n" if self.loopback_name else ""
            hosts_file = "127.0.0.1 localhost\n" + own + "".join(
                f"{self.addresses[h]} {h}\n" for h in self.hosts if not (self.loopback_name and h == host))
            ns, port = self.namespaces[host], self.ports[host]
            _ip("netns", "add", ns)
            inner = f"{PREFIX}{self.token}e{i + 1}"
            _ip("link", "add", inner, "type", "veth", "peer", "name", port)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", port, "netns", self.switch)
            _ip("-n", ns, "link", "set", inner, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(hosts_file)
            os.makedirs(os.path.join(self.workdir, host), exist_ok=True)

    def _start_ssh(self):
        """A key pair for root and one for the hosts, then an sshd in every host."""
        os.makedirs(self.ssh)
        os.makedirs(self.bin)
        for key in ("id_ed25519", "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.ssh, key)],
                           check=True, capture_output=True)
        shutil.copy(os.path.join(self.ssh, "id_ed25519.pub"), os.path.join(self.ssh, "authorized_keys"))
        files = {os.path.join(self.ssh, "config"): SSH_CONFIG, os.path.join(self.bin, "ssh"): SSH}
        for path, text in files.items():
            with open(path, "w") as f:
                f.write(text.format(ssh=self.ssh))
        os.chmod(os.path.join(self.bin, "ssh"), 0o755)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation folder
        for host in self.hosts:
            config = os.path.join(self.ssh, f"sshd_config.{host}")
            with open(config, "w") as f:
                f.write(SSHD_CONFIG.format(address=self.addresses[host], ssh=self.ssh, host=host,
                                           workdir=self.workdir))
            with open(os.path.join(self.ssh, f"sshd.{host}.log"), "w") as log:
                self.sshd[host] = subprocess.Popen(
                    [*self.inside(host), "/usr/sbin/sshd", "-D", "-e", "-f", config],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 20
        for host in self.hosts:
            pid_file = os.path.join(self.ssh, f"sshd.{host}.pid")
            while not os.path.exists(pid_file):  # written once it listens
                if self.sshd[host].poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(self.ssh, f"sshd.{host}.log")) as f:
                        raise RuntimeError(f"sshd on {host} did not start: {f.read()[-2000:]}")
                time.sleep(0.05)

    def inside(self, host, keep_sys=False):
        """The command prefix that runs a command in `host`: its network, and a UTS
        namespace of its own named as the host is. `ip netns exec` also mounts the
        host's /etc/hosts and a /sys of its own; with `keep_sys`, nsenter enters the
        network alone and the machine's /sys stays (slurmd reads its cgroups there)."""
        enter = ["nsenter", f"--net=/run/netns/{self.namespaces[host]}"] if keep_sys else \
            ["ip", "netns", "exec", self.namespaces[host]]
        return [*enter, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.names[host]]

    def env(self, host, base=None):
        """The environment of a command started on `host`: the cluster's ssh first on PATH.

        The hosts share this machine's cores, so MPI ranks that wait yield the
        core instead of spinning on it (mpirun hands OMPI_MCA_* on to every rank).
        """
        env = dict(os.environ if base is None else base)
        env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
        env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(self.workdir, host)
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
        return env

    def start(self, host, cmd, env=None, cwd=None):
        """Starts cmd on `host` as a tagged Launch (see harness/launch.py)."""
        launch = Launch([*self.inside(host), *[str(c) for c in cmd]], env=self.env(host, env), cwd=cwd,
                        workdir=os.path.join(self.workdir, f"launch{len(self.launches)}"))
        self.launches.append(launch)
        return launch

    def cut(self, host):
        """Takes host's port off the bridge: nothing reaches it or leaves it, and it sees no link change."""
        _ip("-n", self.switch, "link", "set", self.ports[host], "nomaster")

    def partition(self, *groups):
        """Puts each group of hosts after the first on a bridge of its own: inside a
        group the hosts still reach each other, across groups nothing passes."""
        for number, group in enumerate(groups[1:], 1):
            _ip("-n", self.switch, "link", "add", f"br{number}", "type", "bridge")
            _ip("-n", self.switch, "link", "set", f"br{number}", "up")
            for host in group:
                _ip("-n", self.switch, "link", "set", self.ports[host], "master", f"br{number}")

    def heal(self, host):
        _ip("-n", self.switch, "link", "set", self.ports[host], "master", "br0")

    def vanish(self, host):
        """A host that dies: cut off first, so that no FIN or RST reaches the others, then killed."""
        self.cut(host)
        _kill_namespace(self.namespaces[host])

    def cap(self, rate, queue="200ms"):
        """A tbf rate limit (e.g. "5mbit") on every host's egress; `queue` is how long a packet
        may wait in its queue (tbf's latency), beyond which the queue drops."""
        for ns in self.namespaces.values():
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                            "burst", "64kb", "latency", queue], check=True, capture_output=True)

    def link_counters(self):
        """{host: {counter: value}}: what each host's egress qdisc dropped, held over its rate
        (overlimits) and requeued, and the TCP segments its kernel sent and sent again."""
        counters = {}
        for host, ns in self.namespaces.items():
            shown = subprocess.run(["tc", "-s", "-j", "-n", ns, "qdisc", "show", "dev", "eth0"], check=True,
                                   capture_output=True, text=True).stdout
            root = json.loads(shown)[0]
            snmp = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"], check=True,
                                  capture_output=True, text=True).stdout.splitlines()
            names, values = [line.split()[1:] for line in snmp if line.startswith("Tcp:")]
            tcp = dict(zip(names, map(int, values)))
            counters[host] = {"qdisc_drops": root.get("drops", 0), "qdisc_overlimits": root.get("overlimits", 0),
                              "qdisc_requeues": root.get("requeues", 0), "tcp_out_segs": tcp["OutSegs"],
                              "tcp_retrans_segs": tcp["RetransSegs"]}
        return counters

    def pids(self, host=None):
        """The processes alive in one host, or in all of them, but for the listening sshd."""
        hosts = [host] if host else self.hosts
        servers = {server.pid for server in self.sshd.values()}
        return [pid for h in hosts for pid in _namespace_pids(self.namespaces[h]) if pid not in servers]

    def left_after(self, seconds=10):
        """The processes still alive in the hosts (described) after up to `seconds`: a
        far daemon or a rank's sentinel ends a moment after the launcher."""
        deadline = time.monotonic() + seconds
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        return [describe(pid) for pid in self.pids()]

    def close(self):
        for launch in self.launches:
            launch.finish(0, linger_s=0)
        for server in self.sshd.values():
            server.kill()
            server.wait()
        for ns in [*self.namespaces.values(), self.switch]:
            _kill_namespace(ns)
            _ip("netns", "delete", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(OWNERS, self.token))
