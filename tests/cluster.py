"""Hosts made of Linux network namespaces, for multi-host tests on one machine.

    switch namespace: bridge br0
       |-- veth -- host1 namespace: eth0 10.213.0.1, hostname host1
       |-- veth -- host2 namespace: eth0 10.213.0.2, hostname host2

Each host has its own address, its own UTS hostname (through `unshare --uts`),
an /etc/hosts naming every host (`ip netns exec` bind-mounts
/etc/netns/NS/hosts over it) and its own Open MPI session directory. A
stand-in for ssh, first on PATH, runs a command inside the named host, so
mpirun and horovodrun start remote ranks exactly as they would over ssh.

Faults: `cut` takes a host's port off the bridge (its carrier stays up, so the
host notices nothing: the silence of a failed switch), `vanish` cuts it and
SIGKILLs every process in it, `cap` puts a tbf rate limit on every host's
egress. `close` kills every process in the namespaces and removes them.
"""
import os
import shutil
import subprocess
import uuid

from runtime.launch import Launch, kill_until_gone

SUBNET = "10.213.0"
PREFIX = "lmt"
TOKEN_LEN = 4
# One file per live cluster, named by its token, holding the pid that made it.
OWNERS = "/run/lm_ptb_clusters"

SSH_STAND_IN = """#!/bin/sh
# ssh stand-in: ssh [options] HOST [options] COMMAND... runs COMMAND in HOST's
# network namespace, with HOST as hostname and its own Open MPI session folder,
# in a session of its own (remote-session, beside this file), as sshd would.
while [ $# -gt 0 ]; do case "$1" in -[oplieFJ]) shift 2;; -*) shift;; *) break;; esac; done
host=$1; shift
while [ $# -gt 0 ]; do case "$1" in -[oplieFJ]) shift 2;; -[a-zA-Z]) shift;; *) break;; esac; done
case "$host" in
{cases}
  *) echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255;;
esac
export OMPI_MCA_orte_tmpdir_base="{workdir}/$host"
mkdir -p "$OMPI_MCA_orte_tmpdir_base"
exec ip netns exec "$ns" unshare --uts "$(dirname "$0")/remote-session" "$host" "$*"
"""

# A stopped process that loses its ssh connection gets SIGHUP and SIGCONT from
# the kernel (its process group is orphaned when sshd's session ends); a
# launcher that SIGTERMs its ssh client relies on that.
REMOTE_SESSION = """#!/bin/sh
hostname "$1" || exit 255
setsid sh -c "$2" <&0 &
session=$!
trap 'kill -HUP -$session 2>/dev/null; kill -CONT -$session 2>/dev/null; exit 255' TERM HUP INT
wait $session
"""


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable_reason():
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if not shutil.which(tool):
            return f"{tool} is not installed (iproute2, util-linux)"
    return None


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


def _namespace_pids(name):
    out = _ip("netns", "pids", name, check=False).stdout
    return [int(pid) for pid in out.split() if pid.isdigit()]


def _kill_namespace(name):
    kill_until_gone(lambda: _namespace_pids(name))


class Cluster:
    def __init__(self, hosts, workdir):
        self.token = uuid.uuid4().hex[:TOKEN_LEN]
        os.makedirs(OWNERS, exist_ok=True)
        with open(os.path.join(OWNERS, self.token), "w") as f:
            f.write(str(os.getpid()))
        self.hosts = [f"host{i + 1}" for i in range(hosts)]
        self.workdir = str(workdir)
        self.switch = f"{PREFIX}{self.token}sw"
        self.namespaces = {host: f"{PREFIX}{self.token}{host}" for host in self.hosts}
        self.addresses = {host: f"{SUBNET}.{i + 1}" for i, host in enumerate(self.hosts)}
        self.ports = {host: f"{PREFIX}{self.token}p{i + 1}" for i, host in enumerate(self.hosts)}
        self.bin = os.path.join(self.workdir, "bin")
        self.launches = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{self.addresses[h]} {h}\n" for h in self.hosts)
        for i, host in enumerate(self.hosts):
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
        os.makedirs(self.bin, exist_ok=True)
        cases = "\n".join(f"  {host}) ns={ns};;" for host, ns in self.namespaces.items())
        for name, text in (("ssh", SSH_STAND_IN.format(cases=cases, workdir=self.workdir)),
                           ("remote-session", REMOTE_SESSION)):
            path = os.path.join(self.bin, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)

    def env(self, host, base=None):
        """The environment of a command started on `host`: the stand-in ssh first on PATH.

        The hosts share this machine's cores, so MPI ranks that wait yield the
        core instead of spinning on it (mpirun hands OMPI_MCA_* on to every rank).
        """
        env = dict(os.environ if base is None else base)
        env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
        env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(self.workdir, host)
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
        return env

    def start(self, host, cmd, env=None, cwd=None):
        """Starts cmd on `host` as a tagged Launch (see runtime/launch.py)."""
        wrapped = ["ip", "netns", "exec", self.namespaces[host], "unshare", "--uts", "sh", "-c",
                   'hostname "$0" && exec "$@"', host, *[str(c) for c in cmd]]
        launch = Launch(wrapped, env=self.env(host, env), cwd=cwd,
                        workdir=os.path.join(self.workdir, f"launch{len(self.launches)}"))
        self.launches.append(launch)
        return launch

    def cut(self, host):
        """Takes host's port off the bridge: nothing reaches it or leaves it, and it sees no link change."""
        _ip("-n", self.switch, "link", "set", self.ports[host], "nomaster")

    def heal(self, host):
        _ip("-n", self.switch, "link", "set", self.ports[host], "master", "br0")

    def vanish(self, host):
        """A host that dies: cut off first, so that no FIN or RST reaches the others, then killed."""
        self.cut(host)
        _kill_namespace(self.namespaces[host])

    def cap(self, rate):
        """A tbf rate limit (e.g. "5mbit") on every host's egress."""
        for ns in self.namespaces.values():
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                            "burst", "64kb", "latency", "200ms"], check=True, capture_output=True)

    def pids(self, host=None):
        """The processes alive in one host, or in all of them."""
        hosts = [host] if host else self.hosts
        return [pid for h in hosts for pid in _namespace_pids(self.namespaces[h])]

    def close(self):
        for launch in self.launches:
            launch.finish(0, linger_s=0)
        for ns in [*self.namespaces.values(), self.switch]:
            _kill_namespace(ns)
            _ip("netns", "delete", ns, check=False)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        try:
            os.remove(os.path.join(OWNERS, self.token))
        except FileNotFoundError:
            pass
