"""Real ``oncekv serve`` processes for the tests.

The binary is ``ONCEKV_BIN`` (default ``<repo>/target/debug/oncekv``); a
missing binary fails the run rather than skipping it. Nodes listen on free
loopback ports, keep their data in a temporary folder, are stopped by PID,
and every wait polls a condition under a deadline. The flags are those of
the Rust harness (``crates/oncekv-harness/src/cluster.rs`` and ``FAST`` in
``testing.rs``).
"""

from __future__ import annotations

import os
import pathlib
import secrets
import signal
import socket
import subprocess
import time
from typing import Callable, List, Optional

import grpc
import pytest

from oncekv._proto import kv_pb2 as pb
from oncekv._proto import kv_pb2_grpc

REPO = pathlib.Path(__file__).resolve().parents[3]

#: Flags that make failover fast on loopback (the Rust tests' `FAST`).
FAST = ["--heartbeat", "50ms", "--election-timeout", "800ms", "--tick-interval", "200ms"]

#: Longest wait for a cluster to elect a leader.
ELECTION = 30.0


def eventually(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Polls ``condition`` until it returns something truthy, or fails the
    test after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as error:  # noqa: BLE001 - reported on timeout
            last_error = error
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error!r})")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def connections_to(address: str) -> int:
    """How many TCP connections to ``address`` (an IPv4 ``host:port`` on
    this machine) the server side holds, established or closed by the client
    only (CLOSE_WAIT), from /proc/net/tcp. The kernel accepts them even
    while the node is stopped, so a rise shows a client dialling again."""
    port = int(address.rsplit(":", 1)[1])
    count = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state in ("01", "08") and int(local.split(":")[1], 16) == port:
                count += 1
    return count


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def binary() -> pathlib.Path:
    path = os.environ.get("ONCEKV_BIN")
    return pathlib.Path(path) if path else REPO / "target" / "debug" / "oncekv"


def node_env():
    """The environment without ONCEKV_* settings, which `oncekv serve`
    would take as flags."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ONCEKV_")}


class Node:
    def __init__(self, binary: pathlib.Path, node_id: int, folder: pathlib.Path):
        self.binary = binary
        self.id = node_id
        self.client = f"127.0.0.1:{free_port()}"
        self.peer = f"127.0.0.1:{free_port()}"
        self.data_dir = folder / f"node-{node_id}"
        self.log_path = folder / f"node-{node_id}.log"
        self.process: Optional[subprocess.Popen] = None
        self.args: List[str] = []

    def start(self) -> None:
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                [str(self.binary), *self.args],
                stdin=subprocess.DEVNULL,
                env=node_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL, then reaps the process."""
        if self.running():
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is paused), then SIGKILL if it
        has not exited within 10 s."""
        if not self.running():
            return
        os.kill(self.process.pid, signal.SIGCONT)
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Cluster:
    """``size`` nodes of ``oncekv serve`` on loopback."""

    def __init__(self, binary: pathlib.Path, size: int, folder: pathlib.Path, extra: Optional[List[str]] = None):
        self.folder = folder
        self.nodes = [Node(binary, i, folder) for i in range(1, size + 1)]
        initial = ",".join(f"{n.id}={n.peer}/{n.client}" for n in self.nodes)
        # The peers share a token, as `oncekv serve` requires of a node of
        # several (the Rust harness makes one the same way: 32 random
        # bytes in hex, mode 0600).
        self.peer_token = folder / "peer-token"
        fd = os.open(self.peer_token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as token:
            token.write(secrets.token_hex(32) + "\n")
        for node in self.nodes:
            node.args = [
                "serve",
                "--id", str(node.id),
                "--data-dir", str(node.data_dir),
                "--listen-client", node.client,
                "--listen-peer", node.peer,
                "--initial-cluster", initial,
                "--peer-token-file", str(self.peer_token),
                "--log", "info",
                *FAST,
                *(extra or []),
            ]  # fmt: skip
        self._channels = {}

    def start(self) -> "Cluster":
        for node in self.nodes:
            node.start()
        return self

    @property
    def endpoints(self) -> List[str]:
        return [n.client for n in self.nodes]

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id - 1]

    def status(self, node: Node, timeout: float = 1.0) -> pb.StatusResponse:
        channel = self._channels.get(node.client)
        if channel is None:
            channel = grpc.insecure_channel(node.client, options=[("grpc.enable_http_proxy", 0)])
            self._channels[node.client] = channel
        return kv_pb2_grpc.KvStub(channel).Status(pb.StatusRequest(), timeout=timeout)

    def leader(self, timeout: float = ELECTION, exclude: Optional[Node] = None) -> Node:
        """The node that leads, once a running node says it does and every
        other running node agrees."""

        def find():
            running = [n for n in self.nodes if n.running() and n is not exclude]
            views = {}
            for node in running:
                try:
                    views[node.id] = self.status(node)
                except grpc.RpcError:
                    return None
            leaders = [self.node(i) for i, s in views.items() if s.is_leader]
            if len(leaders) != 1:
                return None
            agreed = all(s.HasField("leader_id") and s.leader_id == leaders[0].id for s in views.values())
            return leaders[0] if agreed else None

        return eventually(find, timeout, "a leader every running node agrees on")

    def logs(self) -> str:
        return "\n".join(f"--- node {n.id} ---\n{n.log_tail()}" for n in self.nodes)

    def stop_all(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels = {}
        for node in self.nodes:
            node.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture(scope="session")
def oncekv_bin() -> pathlib.Path:
    path = binary()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"no oncekv binary at {path}: build it (cargo build -p oncekv) or set ONCEKV_BIN",
            pytrace=False,
        )
    return path


def _dump_logs_if_failed(request, clusters: List[Cluster]) -> None:
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        for cluster in clusters:
            print(cluster.logs())


@pytest.fixture
def make_cluster(oncekv_bin, tmp_path, request):
    """Starts clusters for one test (``make_cluster(size, extra_flags)``),
    stopped at its end."""
    clusters: List[Cluster] = []

    def make(size: int = 3, extra: Optional[List[str]] = None) -> Cluster:
        folder = tmp_path / f"cluster-{len(clusters) + 1}"
        folder.mkdir()
        cluster = Cluster(oncekv_bin, size, folder, extra)
        clusters.append(cluster)
        cluster.start()
        cluster.leader()
        return cluster

    yield make
    _dump_logs_if_failed(request, clusters)
    for cluster in clusters:
        cluster.stop_all()


@pytest.fixture(scope="module")
def cluster3(oncekv_bin, tmp_path_factory):
    """A 3-node cluster shared by a module's tests (which must leave it
    running)."""
    cluster = Cluster(oncekv_bin, 3, tmp_path_factory.mktemp("cluster3"))
    cluster.start()
    try:
        cluster.leader()
        yield cluster
    finally:
        cluster.stop_all()


def pytest_sessionfinish(session, exitstatus):
    """Under run-tests.sh (ONCEKV_NO_SKIP=1) a skipped test fails the run:
    a check that did not run must not pass silently."""
    if os.environ.get("ONCEKV_NO_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if skipped and session.exitstatus == 0:
        print(f"\n{skipped} test(s) skipped: failing the run (ONCEKV_NO_SKIP=1)")
        session.exitstatus = 1
