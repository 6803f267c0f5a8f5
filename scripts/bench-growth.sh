#!/usr/bin/env bash
# Cost as the work grows: on local clusters of 1 and 3 nodes (127.0.0.1),
# fills the store with KEYS keys of VALUE_BYTES bytes (a sequential fill:
# `oncekv-bench --fill`), or opens SESSIONS live sessions
# (`oncekv-bench --open-sessions`), then measures with the same load
# generator: write throughput and p99 (PUT in session mode over those
# keys, CONCURRENCY writers, DURATION), the resident memory of each node,
# the snapshots taken meanwhile (time from the node's Prometheus histogram,
# size of its snapshot file), a restart of one node (kill -9, time until it
# has applied what the leader had) and a new member's catch-up (`oncekv
# member add`, time until its applied index reaches the leader's). etcd
# (when on PATH and the load generator is a `cargo xtask build-bench`
# build) gets the same fill, load, memory and restart measures on one node,
# with leases standing for sessions (etcd's sessions are leases). The
# table gives each state's live data (keys' and values' bytes) and the
# resident bytes per key or session, and their ratio.
#
# BINS="label:path label:path" runs each step with each binary in turn
# (A B A B), for comparing a change; default: the one BIN. The admin
# commands are always the last of them's, and the load generator is
# BENCH_BIN (default: oncekv-bench beside that binary).
#
# Usage: scripts/bench-growth.sh [OUT.md]
# env: QUICK=1 (small sizes), KEYS="100000 1000000", SESSIONS="10000 100000",
#      NODES="1 3", VALUE_BYTES=1024, CONCURRENCY=64, DURATION=10s,
#      SNAPSHOT_AFTER_ENTRIES=100000 (the node's default), STEP_TIMEOUT=1200 (seconds per step),
#      ETCD=1, CATCHUP=1, BIN=..., BINS=..., BENCH_BIN=..., WORK=... (a temp dir by default),
#      KEEP_LOGS=DIR (keep the nodes' logs there)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/bench-growth.md}}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/oncekv}
if [ -z "${BINS:-}" ]; then
    [ -x "$bin" ] || { echo "no binary at $bin: run cargo xtask build-bench (or set BIN)" >&2; exit 1; }
    BINS="oncekv:$bin"
fi
last=${BINS##* }
BENCH_BIN=${BENCH_BIN:-$(dirname "${last#*:}")/oncekv-bench}
[ -x "$BENCH_BIN" ] || {
    echo "no load generator at $BENCH_BIN: run cargo xtask build-bench (or set BENCH_BIN)" >&2
    exit 1
}
if [ "${QUICK:-0}" = 1 ]; then
    : "${KEYS:=2000 10000}" "${SESSIONS:=500 2000}" "${DURATION:=3s}"
fi
export KEYS=${KEYS:-100000 1000000} SESSIONS=${SESSIONS:-10000 100000} NODES=${NODES:-1 3}
export VALUE_BYTES=${VALUE_BYTES:-1024} CONCURRENCY=${CONCURRENCY:-64} DURATION=${DURATION:-10s}
export SNAPSHOT_AFTER_ENTRIES=${SNAPSHOT_AFTER_ENTRIES:-100000} STEP_TIMEOUT=${STEP_TIMEOUT:-1200}
export ETCD=${ETCD:-1} CATCHUP=${CATCHUP:-1} BINS BENCH_BIN
work=${WORK:-$(mktemp -d)}
export WORK=$work
trap 'rm -rf "$work"' EXIT
python3 - "$out" <<'PY'
import json, os, re, secrets, shutil, signal, socket, statistics, subprocess, sys, time

OUT = sys.argv[1]
WORK = os.environ["WORK"]
BINS = [b.split(":", 1) for b in os.environ["BINS"].split()]
# The admin commands (the last of BINS) and the load generator: one for
# every server measured, so only the servers differ.
CLIENT = BINS[-1][1]
BENCH = os.environ["BENCH_BIN"]
KEYS = [int(k) for k in os.environ["KEYS"].split()]
SESSIONS = [int(s) for s in os.environ["SESSIONS"].split()]
NODES = [int(n) for n in os.environ["NODES"].split()]
VALUE = int(os.environ["VALUE_BYTES"])
CONC = int(os.environ["CONCURRENCY"])
DURATION = os.environ["DURATION"]
SNAP_ENTRIES = os.environ["SNAPSHOT_AFTER_ENTRIES"]
STEP = int(os.environ["STEP_TIMEOUT"])
GIB = 1 << 30
procs = []
# The peers of every cluster share a token, as `oncekv serve` requires of a
# node of several. It goes in the environment (ONCEKV_PEER_TOKEN_FILE), not
# a flag, so binaries older than the flag (BINS) run as before.
TOKEN = os.path.join(WORK, "peer-token")
with open(os.open(TOKEN, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
    f.write(secrets.token_hex(32) + "\n")
NODE_ENV = dict(os.environ, ONCEKV_PEER_TOKEN_FILE=TOKEN)


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def run(args, timeout=STEP):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args[:4]))}...: exit {r.returncode}: {r.stderr[-800:]}")
    return r.stdout


def key_bytes(keys):
    return max(8, 1 + len(str(max(keys - 1, 0))))


def rss_mib(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(rest.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def wait(what, check, timeout=STEP, every=0.05):
    """Polls check() until it returns something truthy; bounded in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except Exception:
            pass
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


class Node:
    def __init__(self, binary, nid, cluster_dir):
        self.bin, self.id = binary, nid
        self.dir = os.path.join(cluster_dir, f"node{nid}")
        self.client, self.peer, self.metrics = (f"127.0.0.1:{port()}" for _ in range(3))
        self.proc = None
        self.extra = []

    def start(self, extra, limits):
        self.extra = extra
        args = [self.bin, "serve", "--id", str(self.id), "--data-dir", self.dir,
                "--listen-client", self.client, "--listen-peer", self.peer,
                "--listen-metrics", self.metrics,
                "--snapshot-after-entries", SNAP_ENTRIES] + limits + extra
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.dir + ".log", "ab"), env=NODE_ENV)
        procs.append(self.proc)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=60)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def status(self):
        out = run([CLIENT, "endpoint", "status", "--endpoints", self.client, "-o", "json"], timeout=10)
        value = json.loads(out)
        rows = value.get("endpoints", value) if isinstance(value, dict) else value
        return rows[0] if isinstance(rows, list) else rows

    def applied(self):
        return self.status().get("applied_index") or 0

    def snapshot_metric(self):
        import urllib.request
        text = urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5).read().decode()
        total = count = copy = 0.0
        for line in text.splitlines():
            if line.startswith("oncekv_snapshot_duration_seconds_sum"):
                total = float(line.split()[-1])
            elif line.startswith("oncekv_snapshot_duration_seconds_count"):
                count = float(line.split()[-1])
            elif line.startswith("oncekv_snapshot_copy_duration_seconds_sum"):
                copy = float(line.split()[-1])
        return total, count, copy

    def snapshot_bytes(self):
        for root, _, files in os.walk(self.dir):
            if "snapshot.bin" in files:
                return os.path.getsize(os.path.join(root, "snapshot.bin"))
        return 0


def limits_for(keys, sessions):
    return ["--store-bytes-max", str(8 * GIB), "--max-snapshot-bytes", str(8 * GIB),
            "--sessions-max", str(max(100_000, sessions + 1000)),
            "--idempotency-keys-max", str(max(1_000_000, 2 * sessions + 1000)),
            # Each open is filed under an idempotency key whose record
            # (about 430 bytes) is kept for its TTL: past ~300,000 opens the
            # default 128 MiB would refuse the rest as overloaded.
            "--idempotency-bytes-max", str(max(128 << 20, 1024 * (2 * sessions + 1000))),
            "--session-opens-per-second", "1000000"]


class Cluster:
    def __init__(self, binary, n, keys, sessions):
        self.bin = binary
        self.dir = os.path.join(WORK, f"c{len(procs)}")
        os.makedirs(self.dir)
        self.limits = limits_for(keys, sessions)
        self.nodes = [Node(binary, i, self.dir) for i in range(1, n + 1)]
        initial = ",".join(f"{x.id}={x.peer}/{x.client}" for x in self.nodes)
        for x in self.nodes:
            x.start(["--initial-cluster", initial], self.limits)
        wait("a leader", self.leader, timeout=60)

    def endpoints(self):
        return ",".join(x.client for x in self.nodes if x.proc.poll() is None)

    def leader(self):
        for x in self.nodes:
            if x.proc.poll() is None:
                try:
                    s = x.status()
                    if s.get("is_leader"):
                        return x
                except Exception:
                    pass
        return None

    def stop(self):
        for x in self.nodes:
            x.stop()
        if os.environ.get("KEEP_LOGS"):
            kept = os.path.join(os.environ["KEEP_LOGS"], time.strftime("%H%M%S-") + os.path.basename(self.dir))
            os.makedirs(kept, exist_ok=True)
            for name in os.listdir(self.dir):
                if name.endswith(".log"):
                    shutil.copy(os.path.join(self.dir, name), kept)
        shutil.rmtree(self.dir, ignore_errors=True)


def bench(binary, endpoints, extra, target="oncekv"):
    args = [BENCH, "--endpoints", endpoints, "--target", target, "-o", "json"] + extra
    return json.loads(run(args).strip().splitlines()[-1])


def fill(binary, endpoints, keys, target="oncekv"):
    t = time.monotonic()
    r = bench(binary, endpoints, ["--workload", "put", "--mode", "plain", "--fill", "--keys", str(keys),
                                  "--key-bytes", str(key_bytes(keys)), "--value-bytes", str(VALUE),
                                  "--ops", str(keys), "--warmup", "0s", "--concurrency", str(CONC),
                                  "--connections", "4"], target)
    # Writes that timed out (outcome unknown) are counted, not retried: a
    # stall longer than the request timeout shows here.
    return time.monotonic() - t, r["throughput_ops"], sum(r["errors"].values())


def load(binary, endpoints, keys, target="oncekv"):
    return bench(binary, endpoints, ["--workload", "put", "--mode", "session", "--keys", str(keys),
                                     "--key-bytes", str(key_bytes(keys)), "--value-bytes", str(VALUE),
                                     "--duration", DURATION, "--warmup", "1s",
                                     "--concurrency", str(CONC), "--connections", "4"], target)


def measure(label, c, kind, size):
    """The common measures on a filled cluster `c`."""
    leader = c.leader()
    before = [x.snapshot_metric() for x in c.nodes]
    r = load(c.bin, c.endpoints(), max(size if kind == "keys" else 1000, 1))
    after = [x.snapshot_metric() for x in c.nodes]
    snaps = [(a[0] - b[0], a[1] - b[1], a[2] - b[2]) for a, b in zip(after, before)]
    taken = sum(s[1] for s in snaps)
    snap_s = sum(s[0] for s in snaps) / taken if taken else None
    rss = [rss_mib(x.proc.pid) for x in c.nodes]
    row = {"bin": label, "nodes": len(c.nodes), "kind": kind, "size": size,
           "put_ops": r["throughput_ops"], "p99_ms": r["p99_ms"], "max_ms": r["max_ms"],
           "errors": sum(r["errors"].values()),
           "rss_mib": [round(x[0]) for x in rss], "peak_rss_mib": [round(x[1]) for x in rss],
           "snapshots": int(taken), "snapshot_s": snap_s,
           # The part of it that holds the state lock (applies wait).
           "snapshot_copy_s": sum(s[2] for s in snaps) / taken if taken else None,
           "snapshot_mib": leader.snapshot_bytes() / (1 << 20)}
    # Restart: kill -9 one node (a follower when there are any), start it
    # again, time until it has applied what the leader had applied.
    victim = next((x for x in c.nodes if x is not leader), leader)
    target_index = leader.applied()
    victim.kill()
    t = time.monotonic()
    victim.start(victim.extra, c.limits)
    wait("the restarted node", lambda: victim.applied() >= target_index)
    row["restart_s"] = time.monotonic() - t
    if os.environ["CATCHUP"] == "1":
        try:
            leader = wait("a leader", c.leader, timeout=60)
            joiner = Node(c.bin, len(c.nodes) + 1, c.dir)
            joiner.start(["--join"], c.limits)
            c.nodes.append(joiner)
            target_index = leader.applied()
            t = time.monotonic()
            # The add returns once the learner has caught up (or gives up).
            run([CLIENT, "member", "add", str(joiner.id), "--peer", joiner.peer, "--client", joiner.client,
                 "--endpoints", leader.client, "--timeout", f"{STEP}s"])
            wait("the new member", lambda: joiner.applied() >= target_index)
            row["catchup_s"] = time.monotonic() - t
            row["joiner_rss_mib"] = round(rss_mib(joiner.proc.pid)[0])
        except Exception as e:  # reported beside the other measures
            log(f"catch-up: {e}")
            row["catchup_error"] = str(e)[:200]
    return row


def oncekv_keys(label, binary, n, keys):
    c = Cluster(binary, n, keys, 0)
    try:
        fill_s, fill_ops, fill_errors = fill(binary, c.endpoints(), keys)
        log(f"{label} n={n} filled {keys} keys in {fill_s:.1f}s")
        row = measure(label, c, "keys", keys)
        row.update(fill_s=fill_s, fill_ops=fill_ops, fill_errors=fill_errors)
        return row
    finally:
        c.stop()


def oncekv_sessions(label, binary, n, sessions):
    c = Cluster(binary, n, 0, sessions)
    try:
        t = time.monotonic()
        out = run([BENCH, "--endpoints", c.endpoints(), "--open-sessions", str(sessions),
                   "--concurrency", str(CONC), "--connections", "4", "-o", "json"])
        opened = json.loads(out.strip().splitlines()[-1])
        if opened["failed"]:
            raise RuntimeError(f"session opens failed: {opened}")
        fill_s = time.monotonic() - t
        log(f"{label} n={n} opened {sessions} sessions in {fill_s:.1f}s")
        row = measure(label, c, "sessions", sessions)
        row.update(fill_s=fill_s, fill_ops=opened["opens_per_s"], fill_errors=opened["failed"])
        return row
    finally:
        c.stop()


def etcd_run(binary, kind, size):
    """etcd on one node: filled with `size` keys, or `size` leases granted
    (etcd's sessions are leases), then the same load, memory and restart."""
    d = os.path.join(WORK, f"etcd-{kind}{size}")
    client, peer = f"127.0.0.1:{port()}", f"127.0.0.1:{port()}"

    def start():
        p = subprocess.Popen(["etcd", "--name", "e1", "--data-dir", d,
                              "--listen-client-urls", f"http://{client}", "--advertise-client-urls", f"http://{client}",
                              "--listen-peer-urls", f"http://{peer}", "--initial-advertise-peer-urls", f"http://{peer}",
                              "--initial-cluster", f"e1=http://{peer}", "--quota-backend-bytes", str(8 * GIB)],
                             stdout=subprocess.DEVNULL, stderr=open(d + ".log", "ab"))
        procs.append(p)
        return p

    def healthy():
        import urllib.request
        with urllib.request.urlopen(f"http://{client}/health", timeout=1) as r:
            return json.loads(r.read()).get("health") == "true"

    os.makedirs(d, exist_ok=True)
    p = start()
    try:
        wait("etcd", healthy, timeout=60)
        if kind == "keys":
            fill_s, fill_ops, fill_errors = fill(binary, client, size, "etcd")
        else:
            t = time.monotonic()
            opened = bench(binary, client, ["--open-sessions", str(size), "--concurrency", str(CONC),
                                            "--connections", "4"], "etcd")
            if opened["failed"]:
                raise RuntimeError(f"lease grants failed: {opened}")
            fill_s, fill_ops, fill_errors = time.monotonic() - t, opened["opens_per_s"], opened["failed"]
        log(f"etcd {kind} {size} in {fill_s:.1f}s")
        r = load(binary, client, max(size if kind == "keys" else 1000, 1), "etcd")
        rss = rss_mib(p.pid)
        db = sum(os.path.getsize(os.path.join(root, f)) for root, _, fs in os.walk(d) for f in fs)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        t = time.monotonic()
        p = start()
        wait("etcd restart", healthy)
        restart_s = time.monotonic() - t
        return {"bin": "etcd", "nodes": 1, "kind": kind, "size": size, "put_ops": r["throughput_ops"],
                "p99_ms": r["p99_ms"], "max_ms": r["max_ms"], "errors": sum(r["errors"].values()),
                "rss_mib": [round(rss[0])], "peak_rss_mib": [round(rss[1])], "snapshots": None,
                "snapshot_s": None, "snapshot_mib": db / (1 << 20), "restart_s": restart_s,
                "fill_s": fill_s, "fill_ops": fill_ops, "fill_errors": fill_errors}
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=60)
        shutil.rmtree(d, ignore_errors=True)


rows = []
jsonl = os.path.splitext(OUT)[0] + ".jsonl"


def record(row):
    rows.append(row)
    with open(jsonl, "a") as f:
        f.write(json.dumps(row) + "\n")
    log(json.dumps(row))


def attempt(what, fn, *a):
    try:
        record(fn(*a))
    except Exception as e:  # a size that does not fit is reported, not fatal
        log(f"{what}: {e}")
        record({"bin": a[0] if isinstance(a[0], str) else "etcd", "failed": what, "why": str(e)[:300]})


load_avg = os.getloadavg()
for n in NODES:
    for keys in KEYS:
        for label, binary in BINS:
            attempt(f"{label} {n} nodes {keys} keys", oncekv_keys, label, binary, n, keys)
    for sessions in SESSIONS:
        for label, binary in BINS:
            attempt(f"{label} {n} nodes {sessions} sessions", oncekv_sessions, label, binary, n, sessions)
if os.environ["ETCD"] == "1" and shutil.which("etcd"):
    for keys in KEYS:
        attempt(f"etcd {keys} keys", etcd_run, BINS[-1][1], "keys", keys)
    for sessions in SESSIONS:
        attempt(f"etcd {sessions} leases", etcd_run, BINS[-1][1], "sessions", sessions)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


lines = [
    f"{VALUE}-byte values, {CONC} writers over 4 connections; load: PUT (session mode) of random keys "
    f"for {DURATION} after 1 s warm-up; snapshot after {SNAP_ENTRIES} entries. "
    f"Machine: {os.cpu_count()} cores, load average before {load_avg[0]:.1f}, after {os.getloadavg()[0]:.1f}.",
    "",
    "| binary | nodes | state | live MiB | fill s (ops/s; timed out) | put ops/s | p99 ms | max ms | RSS MiB per node (peak) | RSS per entry, bytes (/ live) | snapshots: mean s (of it under the lock), MiB | restart s | catch-up s (new member RSS MiB) |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for r in rows:
    if "failed" in r:
        lines.append(f"| {r['bin']} | | {r['failed']}: {r['why']} | | | | | | | | | | |")
        continue
    rss = ", ".join(f"{a} ({b})" for a, b in zip(r["rss_mib"], r["peak_rss_mib"]))
    snap = f"{r['snapshots']}: {fmt(r['snapshot_s'], '.2f')} s ({fmt(r.get('snapshot_copy_s'), '.2f')} s), {r['snapshot_mib']:.0f}" if r["snapshots"] is not None \
        else f"db {r['snapshot_mib']:.0f}"
    catch = f"{r['catchup_s']:.1f} ({r['joiner_rss_mib']})" if "catchup_s" in r else \
        ("failed" if "catchup_error" in r else "-")
    # Live data: the keys' and values' bytes (a session or lease holds
    # none of a user's); per entry: the largest node's resident bytes.
    live = r["size"] * (key_bytes(r["size"]) + VALUE) if r["kind"] == "keys" else None
    per_entry = max(r["rss_mib"]) * (1 << 20) / max(r["size"], 1)
    ratio = f" ({max(r['rss_mib']) * (1 << 20) / live:.2f}x)" if live else ""
    kind = "leases" if r["kind"] == "sessions" and r["bin"] == "etcd" else r["kind"]
    lines.append(f"| {r['bin']} | {r['nodes']} | {r['size']:,} {kind} | {fmt(live and live / (1 << 20), '.0f')} | "
                 f"{r['fill_s']:.0f} ({r['fill_ops']:.0f}; {r['fill_errors']}) | "
                 f"{r['put_ops']:.0f} | {r['p99_ms']:.1f} | {r['max_ms']:.0f} | {rss} | {per_entry:.0f}{ratio} | {snap} | "
                 f"{r['restart_s']:.2f} | {catch} |")
open(OUT, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
