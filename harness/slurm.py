"""A Slurm cluster on namespace hosts (harness/cluster.py), for the Slurm tests.

    switch namespace: br0 10.213.0.254, host name slurmctl: slurmctld, munged, the client commands
       |-- host1: slurmd, node host1 (2 CPUs)
       |-- host2: slurmd, node host2 (2 CPUs)

The switch's namespace doubles as the controller and login host, so that a
cut host loses the controller as it loses the other hosts. One munged, on a
key and socket of this cluster's own, serves every daemon and command: its
socket is a file, which every network namespace reaches. Every daemon runs in
a namespace of the cluster, so Cluster.close ends them with the rest, and
cluster.remove_stale the cluster of a test process that died.

slurmd enters its host's network with nsenter, not `ip netns exec`, which
mounts a /sys of the namespace's own where slurmd finds no cgroup file system.
"""
import os
import shutil
import subprocess
import tempfile
import time

from harness.cluster import Cluster

CONTROLLER = "slurmctl"
CONTROLLER_ADDRESS = "254"  # on the cluster's subnet
PACKAGE_LIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                            "slurm_packages.txt")
SLURMD_TIMEOUT_S = 10
# What a client command prints when slurmctld has not answered within MessageTimeout.
CONTROLLER_SILENT = "Socket timed out on send/recv operation"
QUERY_TRIES = 3

SLURM_CONF = """ClusterName=lmptb
SlurmctldHost={controller}({controller_address})
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s before it may start again (120 s by
# default); the credential only needs to outlive a step's launch.
AuthInfo=socket={dir}/munge/socket,cred_expire=10
StateSaveLocation={dir}/state
SlurmctldPidFile={dir}/slurmctld.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdPidFile={dir}/%n/slurmd.pid
SlurmdSpoolDir={dir}/%n/spool
SlurmdLogFile={dir}/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The scheduler looks at the queue every second, so a requeued job starts as
# soon as its hold ends and its nodes are back, not at the next minute.
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
# A node whose slurmd stops answering is DOWN after SlurmdTimeout, and comes
# back by itself once its slurmd registers again. A ping to a host that is gone
# keeps trying to connect for MessageTimeout (10 s at most), and no other ping
# starts meanwhile: 5 s lets the pings that find it gone come twice as often.
SlurmdTimeout={slurmd_timeout}
MessageTimeout=5
ReturnToService=2
# A cancelled job's processes get SIGTERM, and SIGKILL KillWait s later: ranks
# need a step and a checkpoint's write to stop on SIGTERM.
KillWait=5
# Jobs are requeued (by Slurm on a node failure, or by scontrol requeue) only
# when they ask with --requeue, as on sites that turn the default off.
JobRequeue=0
MpiDefault=none
{nodes}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

NODE = "NodeName={name} NodeAddr={address} CPUs=2 State=UNKNOWN\n"


def packages():
    """The Debian packages of this cluster, as scripts/setup.sh installs them: PACKAGE_LIST's words."""
    with open(PACKAGE_LIST) as f:
        return " ".join(f.read().split())


def installed():
    """Whether this machine has Slurm's daemons, its client commands and munged."""
    return all(shutil.which(tool) for tool in ("munged", "slurmctld", "slurmd", "sbatch"))


class SlurmCluster:
    """slurmctld, munged and a slurmd per host on a harness.cluster.Cluster of
    `hosts` hosts (`self.cluster`), made here and removed by `close`.

    Its node names are the hosts' names (the UTS names slurmd reads), and it
    is ready when every node is idle.
    """

    def __init__(self, hosts=2, start_timeout=60):
        # A short path: the sockets of munged and of the job steps in the spool must fit a socket path.
        cluster = self.cluster = Cluster(hosts, tempfile.mkdtemp(prefix="sl.", dir="/tmp"))
        self.dir = os.path.join(cluster.workdir, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.address = f"{cluster.addresses[cluster.hosts[0]].rsplit('.', 1)[0]}.{CONTROLLER_ADDRESS}"
        self.daemons = {}  # name -> Popen
        try:
            self._configure()
            self._start_munged()
            self._start("slurmctld", self._in_controller(["slurmctld", "-D", "-i", "-f", self.conf], CONTROLLER))
            for host in cluster.hosts:
                self.start_slurmd(host)
            self.wait_idle(start_timeout)
        except BaseException:
            self.close()
            raise

    def _configure(self):
        subprocess.run(["ip", "-n", self.cluster.switch, "addr", "add", f"{self.address}/24", "dev", "br0"],
                       check=True, capture_output=True)
        subprocess.run(["ip", "-n", self.cluster.switch, "link", "set", "lo", "up"], check=True, capture_output=True)
        nodes = "".join(NODE.format(name=self.cluster.names[host], address=self.cluster.addresses[host])
                        for host in self.cluster.hosts)
        os.makedirs(os.path.join(self.dir, "state"))
        for host in self.cluster.hosts:
            os.makedirs(os.path.join(self.dir, self.cluster.names[host], "spool"))
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(controller=CONTROLLER, controller_address=self.address, dir=self.dir,
                                      slurmd_timeout=SLURMD_TIMEOUT_S, nodes=nodes))

    def _start_munged(self):
        munge = os.path.join(self.dir, "munge")
        # munged refuses a socket folder that not everyone may enter, up to /.
        os.makedirs(munge)
        for folder in (self.cluster.workdir, self.dir, munge):
            os.chmod(folder, 0o755)
        key = os.path.join(munge, "key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self._start("munged", self._in_controller(
            ["munged", "-F", f"--socket={munge}/socket", f"--key-file={key}", f"--pid-file={munge}/pid",
             f"--seed-file={munge}/seed", f"--log-file={munge}/log"]))
        self._wait_for(lambda: os.path.exists(f"{munge}/socket"), 20, lambda: "munged did not start")

    def _in_controller(self, cmd, name=None):
        """cmd in the controller's namespace, under its own host name when `name` is given."""
        prefix = ["ip", "netns", "exec", self.cluster.switch]
        if name:
            prefix += ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name]
        return [*prefix, *cmd]

    def _start(self, name, cmd):
        if name in self.daemons:  # one that ended, or a host's slurmd killed with its host
            self.daemons[name].kill()
            self.daemons[name].wait()
        with open(os.path.join(self.dir, f"{name}.out"), "w") as log:
            self.daemons[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                  start_new_session=True)

    def _wait_for(self, ready, timeout, failure):
        """Waits until ready() holds; raises RuntimeError(failure()), with the logs of
        the daemons that ended, once one ended or time is up."""
        deadline = time.monotonic() + timeout
        while not ready():
            ended = [name for name, daemon in self.daemons.items() if daemon.poll() is not None]
            if ended or time.monotonic() > deadline:
                logs = "".join(f"\n{name}: {self.log(name)[-1500:]}" for name in ended)
                raise RuntimeError(f"{failure()}{logs}")
            time.sleep(0.1)

    def log(self, name):
        """What daemon `name` (munged, slurmctld, slurmd.HOST) wrote on its output."""
        try:
            with open(os.path.join(self.dir, f"{name}.out"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def start_slurmd(self, host):
        """Starts (or starts again) the slurmd of `host`."""
        self._start(f"slurmd.{host}", self.cluster.inside(host, keep_sys=True) + ["slurmd", "-D", "-f", self.conf])

    def env(self, base=None):
        """The environment of a client command: the cluster's slurm.conf."""
        return dict(os.environ if base is None else base, SLURM_CONF=self.conf)

    def command(self, *args, env=None, cwd=None, timeout=30, check=True, query=False):
        """Runs a client command (sbatch, squeue, scontrol, ...) on the login host. A query
        (a read that changes nothing) is asked again, up to QUERY_TRIES times in all, when
        slurmctld does not answer it within MessageTimeout, as on a machine whose cores the
        tests' ranks fill; a command that acts is never repeated."""
        for _ in range(QUERY_TRIES if query else 1):
            done = subprocess.run(self._in_controller([str(a) for a in args]), env=self.env(env), cwd=cwd,
                                  capture_output=True, text=True, timeout=timeout)
            if CONTROLLER_SILENT not in done.stderr:
                break
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def nodes(self):
        """{node name: state} as sinfo sees them (idle, alloc, down*, ...)."""
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t", query=True).stdout
        return dict(line.split() for line in out.splitlines())

    def wait_idle(self, timeout):
        """Waits until every node is idle."""
        self._wait_for(lambda: set(self.nodes().values()) == {"idle"}, timeout,
                       lambda: f"the Slurm nodes are not all idle after {timeout} s: {self.nodes()}")

    def submit(self, *args, env=None, cwd=None):
        """sbatch ARGS...; returns the job id."""
        return self.command("sbatch", "--parsable", *args, env=env, cwd=cwd).stdout.strip().split(";")[0]

    def job(self, job_id):
        """The job's fields as `scontrol show job` gives them (JobState, Restarts, NodeList, ExitCode, ...)."""
        out = self.command("scontrol", "-o", "show", "job", job_id, query=True).stdout
        return dict(word.split("=", 1) for word in out.split() if "=" in word)

    def job_processes(self, host):
        """The processes alive in `host` but for its slurmd and sshd: those of jobs."""
        daemon = self.daemons.get(f"slurmd.{host}")
        return [pid for pid in self.cluster.pids(host) if daemon is None or pid != daemon.pid]

    def close(self):
        for daemon in self.daemons.values():
            daemon.kill()
            daemon.wait()
        self.cluster.close()
        shutil.rmtree(self.cluster.workdir, ignore_errors=True)
