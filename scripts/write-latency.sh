#!/usr/bin/env bash
# Where a write's time goes, from the nodes' own Prometheus histograms:
# runs `oncekv-bench` (PUTs, one writer on a session by default) against a
# running cluster, reads every node's /metrics before and after, and prints
# the mean of each step over the run: the client's write end to end, the
# leader's time from proposing to the answer
# (`oncekv_request_duration_seconds`), each node's log fsync and apply.
#
# Usage: scripts/write-latency.sh CLIENT_ENDPOINTS METRICS_ADDRESSES [BENCH FLAGS...]
#   CLIENT_ENDPOINTS   host:port,... of the nodes' client ports
#   METRICS_ADDRESSES  host:port,... of their `--listen-metrics`
#   BENCH FLAGS        default: --mode session --concurrency 1 --duration 5s
#   env: BIN (default target/release/oncekv-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n '2,14p' "$0" >&2; exit 2; }
bin=${BIN:-target/release/oncekv-bench}
endpoints=$1 metrics=$2
shift 2
[[ $# -gt 0 ]] || set -- --mode session --concurrency 1 --duration 5s
exec python3 - "$bin" "$endpoints" "$metrics" "$@" <<'PY'
import json, subprocess, sys, urllib.request
bin, endpoints, metrics, flags = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]

def scrape():
    values = {}
    for node, address in enumerate(metrics):
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            values[(node, name)] = float(value)
    return values

before = scrape()
run = subprocess.run([bin, "--endpoints", endpoints, "--workload", "put", "--warmup", "1s",
                      "-o", "json"] + flags, capture_output=True, text=True, check=True)
report = json.loads(run.stdout)
after = scrape()

def mean_ms(node, name, labels=""):
    total = after.get((node, f"{name}_sum{labels}"), 0) - before.get((node, f"{name}_sum{labels}"), 0)
    count = after.get((node, f"{name}_count{labels}"), 0) - before.get((node, f"{name}_count{labels}"), 0)
    return (f"{total / count * 1000:.3f} ms" if count else "-"), int(count)

leader = next((n for n in range(len(metrics)) if after.get((n, "oncekv_raft_is_leader")) == 1), None)
print(f"client: {report['throughput_ops']:.0f} writes/s, p50 {report['p50_ms']:.3f} ms, "
      f"mean {report.get('mean_ms', float('nan')):.3f} ms")
if leader is not None:
    mean, count = mean_ms(leader, "oncekv_request_duration_seconds", '{operation="put",outcome="applied"}')
    print(f"leader (node {leader + 1}): proposed to answered, mean {mean} ({count} writes)")
for node in range(len(metrics)):
    fsync, syncs = mean_ms(node, "oncekv_log_fsync_duration_seconds")
    apply, applies = mean_ms(node, "oncekv_apply_duration_seconds")
    role = " (leader)" if node == leader else ""
    print(f"node {node + 1}{role}: fsync mean {fsync} ({syncs}), apply mean {apply} ({applies})")
PY
