"""A local Ray cluster of several node processes on this machine, for tests and benchmarks.

    from ray_cluster import RayCluster
    with RayCluster(folder, cpus_per_node=1) as cluster:
        cluster.add_node()                 # a second node, a process group of its own
        ... sweep launch --command_launcher ray --ray_address cluster.address ...
        cluster.fail_node(cluster.nodes[1])  # the node fails: its tasks die with it

Each node is `ray start --block` in a session of its own, on 127.0.0.1, with the
cluster's own temp dir and free ports, so stopping one node (its process group, by id)
touches neither the other nodes nor any other Ray on the machine (`ray stop` would stop
every Ray process of this user). The cluster uses Ray's token authentication with a token
of its own: a client needs `cluster.env()` (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH).
"""
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_binary():
    """The `ray` command beside this Python, else on PATH, else None."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    return beside if os.path.exists(beside) else shutil.which("ray")


class RayNode:
    """One `ray start --block` process group."""

    def __init__(self, argv, log_path, env):
        self.log = open(log_path, "ab")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **env)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)

    def stop(self):
        """Kill every process of the node's session (`ray start`, the raylet, its workers
        in their own process groups, and the jobs they run), as a node failure would."""
        sid = self.proc.pid
        for _ in range(3):   # a process forked while we kill gets the next round
            pids = session_pids(sid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        self.proc.wait()
        self.log.close()


def session_pids(sid):
    """Live processes whose session id is `sid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


class RayCluster:
    """A head node and any number of worker nodes, each offering `cpus_per_node` CPUs."""

    def __init__(self, folder, cpus_per_node=1, timeout=120):
        self.folder = os.path.abspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.cpus_per_node, self.timeout = cpus_per_node, timeout
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes = []
        # Ray's sockets live in its temp dir, and a socket path has at most 107 bytes
        self.temp_dir = tempfile.mkdtemp(prefix="ray-")
        self.token_path = os.path.join(self.folder, "auth_token")
        with open(os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w") as f:
            f.write(secrets.token_hex(32))

    def env(self):
        """What a client (or a node) needs in its environment to join this cluster."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path}

    def _start(self, extra):
        ray = ray_binary()
        if ray is None:
            raise RuntimeError("the `ray` command was not found (pip install 'ray[default]')")
        argv = [ray, "start", "--block", "--node-ip-address", "127.0.0.1",
                "--num-cpus", str(self.cpus_per_node), "--num-gpus", "0",
                "--disable-usage-stats", *extra]
        node = RayNode(argv, os.path.join(self.folder, f"node{len(self.nodes)}.log"),
                       self.env())
        self.nodes.append(node)
        return node

    def start_head(self):
        self._start(["--head", "--port", str(self.port), "--temp-dir", self.temp_dir,
                     "--include-dashboard", "false",
                     "--ray-client-server-port", str(_free_port())])
        self.wait_for_nodes(1)
        return self

    def add_node(self):
        node = self._start(["--address", self.address])
        self.wait_for_nodes(len(self.nodes))
        return node

    def alive_nodes(self):
        """How many nodes the head counts as alive (asked from a fresh process)."""
        code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                "print(sum(n['Alive'] for n in ray.nodes()))")
        proc = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True,
                              text=True, timeout=self.timeout,
                              env=dict(os.environ, **self.env()))
        try:
            return int(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def wait_for_nodes(self, n):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if any(node.proc.poll() is not None for node in self.nodes):
                raise RuntimeError(f"a Ray node exited; see the logs in {self.folder}")
            if self._head_listening() and self.alive_nodes() >= n:
                return
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster did not reach {n} nodes within "
                           f"{self.timeout} s; see the logs in {self.folder}")

    def fail_node(self, node):
        """Kill `node` as a machine failure would, then wait until the head counts it dead.

        Every node here shares one IP address, so a driver started before the head's health
        checks notice the loss may attach to the dead node's raylet (Ray 2.9 does) and exit;
        on a real cluster a driver attaches to its own machine's raylet."""
        node.stop()
        self.nodes.remove(node)
        deadline = time.monotonic() + self.timeout
        while self.alive_nodes() > len(self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head still counts a killed node as alive after "
                                   f"{self.timeout} s; see the logs in {self.folder}")
            time.sleep(1)

    def _head_listening(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self):
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self.start_head()

    def __exit__(self, *exc):
        self.stop()
