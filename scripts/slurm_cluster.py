"""Start and stop a single-node Slurm cluster in a folder, for tests and benchmarks.

    python scripts/slurm_cluster.py start /tmp/slurm     # prints: export SLURM_CONF=...
    eval "$(python scripts/slurm_cluster.py start /tmp/slurm)"
    sbatch --wrap 'hostname'; squeue
    python scripts/slurm_cluster.py stop /tmp/slurm

Everything lives in the folder: slurm.conf, a fresh munge key, munged's socket, the
controller's state, the daemons' logs and pid files. munged, slurmctld and slurmd run as
local processes of this user (slurmd wants root: this machine's tests run as root), on
free ports of 127.0.0.1, with one partition `debug` holding this machine's CPUs. Clients
find the cluster through SLURM_CONF; nothing under /etc is read or written.

Needs Debian's `slurm-wlm` and `munge` packages (`.ci/run` installs them).
"""
import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time

DAEMONS = ("slurmd", "slurmctld", "munged")   # stopped in this order
PARTITION = "debug"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


def missing_binaries():
    """The Slurm and munge programs this script needs that are not on PATH."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return [name for name in BINARIES if shutil.which(name, path=path) is None]


def _binary(name):
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    found = shutil.which(name, path=path)
    if found is None:
        raise SystemExit(f"error: {name} not found (Debian: apt-get install slurm-wlm munge)")
    return found


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _memory_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 1024


def slurm_conf(folder, ctld_port, slurmd_port, cpus, memory_mb):
    """The text of slurm.conf: one node (this host) in one partition, no cgroups, no
    accounting database; finished jobs stay visible to `scontrol show job` for an hour."""
    host = socket.gethostname().split(".")[0]
    return "\n".join([
        "ClusterName=oodbed",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder}/munge/munge.socket",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=2",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={folder}/jobcomp.txt",
        "MinJobAge=3600",
        "KillWait=5",
        "OverTimeLimit=0",
        "ReturnToService=2",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "MailProg=/bin/true",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def environment(folder):
    """The environment variables a Slurm client needs to reach this cluster."""
    return {"SLURM_CONF": os.path.join(os.path.abspath(folder), "slurm.conf")}


def start(folder, cpus=None, timeout=60):
    """Write the configuration, start munged, slurmctld and slurmd, wait until the node is
    idle; return the client environment (SLURM_CONF)."""
    folder = os.path.abspath(folder)
    for sub in ("munge", "state", "spool"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    os.chmod(os.path.join(folder, "munge"), 0o700)
    key = os.path.join(folder, "munge", "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(secrets.token_bytes(1024))
    ctld_port, slurmd_port = _free_ports(2)
    conf = os.path.join(folder, "slurm.conf")
    with open(conf, "w") as f:
        f.write(slurm_conf(folder, ctld_port, slurmd_port, cpus or os.cpu_count() or 1,
                           max(256, _memory_mb() - 512)))
    env = dict(os.environ, **environment(folder))
    munge = os.path.join(folder, "munge")
    _run([_binary("munged"), "--force", f"--key-file={key}",
          f"--socket={munge}/munge.socket", f"--pid-file={folder}/munged.pid",
          f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"], env)
    _run([_binary("slurmctld"), "-f", conf], env)
    _run([_binary("slurmd"), "-f", conf], env)
    _wait_for_idle_node(env, timeout)
    return environment(folder)


def _run(argv, env):
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(argv[:1])} failed: "
                         f"{(proc.stderr or proc.stdout).strip()}")


def _wait_for_idle_node(env, timeout):
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                              text=True)
        last = (proc.stdout or proc.stderr).strip()
        if proc.returncode == 0 and last.startswith("idle"):
            return
        time.sleep(0.5)
    raise SystemExit(f"error: the Slurm node did not come up within {timeout} s "
                     f"(sinfo: {last!r}); see the logs in {os.path.dirname(env['SLURM_CONF'])}")


def stop(folder, timeout=20):
    """Stop the cluster's daemons (by the pids in their pid files), then every process
    left from its jobs: slurmstepd, srun and the job scripts outlive slurmd, and would
    linger after the tests (found by SLURM_CONF=<this cluster> in their environment)."""
    folder = os.path.abspath(folder)
    for name in DAEMONS:
        pid = _read_pid(os.path.join(folder, f"{name}.pid"))
        if pid is None:
            continue
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    for pid in _job_processes(environment(folder)["SLURM_CONF"]):
        _signal(pid, signal.SIGKILL)


def _job_processes(conf):
    """Pids of this machine's processes whose environment names this cluster's config."""
    marker = f"SLURM_CONF={conf}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:   # gone, or not ours to read
            continue
    return pids


def _read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("folder", help="where the cluster's configuration and state live")
    parser.add_argument("--cpus", type=int, default=None,
                        help="CPUs the node offers (default: this machine's)")
    args = parser.parse_args(argv)
    if args.action == "start":
        for name, value in start(args.folder, cpus=args.cpus).items():
            print(f"export {name}={value}")
    else:
        stop(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
