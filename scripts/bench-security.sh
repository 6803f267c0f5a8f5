#!/usr/bin/env bash
# The cost of security, measured side by side: a plaintext 3-node oncekv
# cluster against one with TLS on both ports (mutual TLS between peers) and
# authentication enforced (a user with readwrite on every key, logged in
# with a password; every call carries its token), same machine, same run,
# alternating A B A B for ROUNDS rounds, at 1 and 64 writers with sessions.
# (etcd's own TLS cost is not measured here: `oncekv bench --target etcd`
# speaks plaintext only; the report says so.)
#
# Usage: scripts/bench-security.sh [OUT_DIR]
#   env: ROUNDS=3 DURATION=5s WARMUP=1s
#        QUICK=1  one round of 2 s; writes to target/bench-security-quick/
# Writes OUT_DIR/benchmarks-security.md (default OUT_DIR: docs).
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="$0${1:+ $1}"
for var in QUICK ROUNDS DURATION WARMUP; do
    [[ -n "${!var:-}" ]] && command_line="$var=${!var} $command_line"
done
if [[ "${QUICK:-0}" == 1 ]]; then
    rounds=${ROUNDS:-1}
    duration=${DURATION:-2s}
    warmup=${WARMUP:-0.5s}
    out_dir=${1:-target/bench-security-quick}
else
    rounds=${ROUNDS:-3}
    duration=${DURATION:-5s}
    warmup=${WARMUP:-1s}
    out_dir=${1:-docs}
fi
python3 --version >/dev/null

cargo xtask build-bench
bin=$PWD/target/release/oncekv
mkdir -p target "$out_dir"
work=$(mktemp -d "$PWD/target/bench-security.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

certs="$work/certs"
"$bin" certs create-ca --dir "$certs" >/dev/null
for id in 1 2 3; do
    "$bin" certs create-node --dir "$certs" --id "$id" --host 127.0.0.1 >/dev/null
done
tls_client=(--cacert "$certs/ca.pem")

# start NAME SECURE: three nodes; sets endpoints_NAME.
start() {
    local name=$1 secure=$2 id cluster="" endpoints=""
    local -a client peer flags
    for id in 1 2 3; do
        client[$id]="127.0.0.1:$(port)"
        peer[$id]="127.0.0.1:$(port)"
        cluster+="${cluster:+,}$id=${peer[$id]}/${client[$id]}"
        endpoints+="${endpoints:+,}${client[$id]}"
    done
    for id in 1 2 3; do
        flags=()
        if [[ "$secure" == 1 ]]; then
            flags=(--cert-file "$certs/node-$id.pem" --key-file "$certs/node-$id-key.pem"
                --peer-cert-file "$certs/node-$id.pem" --peer-key-file "$certs/node-$id-key.pem"
                --peer-ca-file "$certs/ca.pem")
        fi
        "$bin" serve --id "$id" --data-dir "$work/$name/node$id" --listen-client "${client[$id]}" \
            --listen-peer "${peer[$id]}" --initial-cluster "$cluster" "${flags[@]}" \
            2>"$work/$name-node$id.log" &
        pids+=($!)
    done
    local -a reach=()
    [[ "$secure" == 1 ]] && reach=("${tls_client[@]}")
    for _ in $(seq 100); do
        "$bin" endpoint health --endpoints "$endpoints" "${reach[@]}" >/dev/null 2>&1 && break
        sleep 0.2
    done
    "$bin" endpoint health --endpoints "$endpoints" "${reach[@]}" >/dev/null
    if [[ "$secure" == 1 ]]; then
        local as=(--endpoints "$endpoints" "${reach[@]}")
        "$bin" user add root --password root-pw "${as[@]}" >/dev/null
        "$bin" user grant-role root admin "${as[@]}" >/dev/null
        "$bin" role add bench "${as[@]}" >/dev/null
        "$bin" role grant bench readwrite "" --prefix "${as[@]}" >/dev/null
        "$bin" user add bench --password bench-pw "${as[@]}" >/dev/null
        "$bin" user grant-role bench bench "${as[@]}" >/dev/null
        "$bin" auth enable "${as[@]}" >/dev/null
    fi
    printf -v "endpoints_$name" '%s' "$endpoints"
}

results="$work/results.jsonl"
# run SECURE ENDPOINTS CONCURRENCY ROUND
run() {
    local secure=$1 endpoints=$2 concurrency=$3 round=$4 report
    local -a extra=()
    [[ "$secure" == 1 ]] && extra=("${tls_client[@]}" --user bench:bench-pw)
    report=$("$bin" bench --endpoints "$endpoints" --workload put --mode session \
        --concurrency "$concurrency" --key-bytes 8 --value-bytes 64 \
        --duration "$duration" --warmup "$warmup" -o json "${extra[@]}")
    printf '{"secure":%s,"round":%s,"report":%s}\n' "$secure" "$round" "$report" >>"$results"
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
print("  %-9s x%-3d %8.0f ops/s  p50 %6.2f ms  p99 %6.2f ms  errors %s" % (
    "tls+auth" if sys.argv[2] == "1" else "plaintext", r["concurrency"], r["throughput_ops"],
    r["p50_ms"], r["p99_ms"], r["errors"] or "none"))' "$report" "$secure" >&2
}

start plain 0
start secure 1
for round in $(seq "$rounds"); do
    for concurrency in 1 64; do
        run 0 "$endpoints_plain" "$concurrency" "$round"
        run 1 "$endpoints_secure" "$concurrency" "$round"
    done
    echo "round $round of $rounds done" >&2
done

python3 - "$results" "$out_dir/benchmarks-security.md" "$command_line" "$rounds" "$duration" <<'PY'
import json, statistics, sys, platform, os
rows = [json.loads(line) for line in open(sys.argv[1])]
out, command, rounds, duration = sys.argv[2:6]
def med(secure, concurrency, field):
    values = [r["report"][field] for r in rows
              if r["secure"] == secure and r["report"]["concurrency"] == concurrency]
    return statistics.median(values)
lines = [
    "# The cost of security",
    "",
    f"Measured by `{command}` ({rounds} round(s) of {duration}, medians), on "
    f"{os.cpu_count()} cores ({platform.machine()}): a 3-node oncekv cluster in plaintext "
    "against one with TLS on the client and peer ports (peers authenticate each other "
    "with node certificates) and authentication enforced (every call carries a login "
    "token, checked against the replicated users; every entry carries its principal and "
    "apply checks its permission), alternating A B A B. Durable PUTs of 64-byte values "
    "to 8-byte keys on sessions.",
    "",
    "| writers | plaintext ops/s | TLS + auth ops/s | ratio | plaintext p50 / p99 ms | TLS + auth p50 / p99 ms |",
    "|---|---|---|---|---|---|",
]
for c in (1, 64):
    p, s = med(0, c, "throughput_ops"), med(1, c, "throughput_ops")
    lines.append(
        f"| {c} | {p:.0f} | {s:.0f} | {s / p:.2f}x | "
        f"{med(0, c, 'p50_ms'):.2f} / {med(0, c, 'p99_ms'):.2f} | "
        f"{med(1, c, 'p50_ms'):.2f} / {med(1, c, 'p99_ms'):.2f} |")
lines += [
    "",
    "etcd with TLS is not in this run: `oncekv bench --target etcd` speaks "
    "plaintext only, so etcd's own cost of TLS, the reference, is still to be "
    "measured side by side.",
    "",
]
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
PY
