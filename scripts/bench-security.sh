#!/usr/bin/env bash
# The cost of security, measured side by side: 3-node oncekv clusters in
# plaintext, with TLS on both ports (mutual TLS between peers), and with
# TLS and authentication enforced (a user with readwrite on every key,
# logged in with a password; every call carries its token), beside etcd in
# plaintext and with TLS on both ports, same machine, same run, every
# configuration in turn for ROUNDS rounds, at 1 and 64 writers.
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
bench_bin=$PWD/target/release/oncekv-bench
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

# start_oncekv NAME MODE (plain | tls | tls+auth): three nodes; sets endpoints_NAME.
start_oncekv() {
    local name=$1 mode=$2 id cluster="" endpoints=""
    local -a client peer flags reach=()
    for id in 1 2 3; do
        client[$id]="127.0.0.1:$(port)"
        peer[$id]="127.0.0.1:$(port)"
        cluster+="${cluster:+,}$id=${peer[$id]}/${client[$id]}"
        endpoints+="${endpoints:+,}${client[$id]}"
    done
    [[ "$mode" != plain ]] && reach=("${tls_client[@]}")
    for id in 1 2 3; do
        # plain is the baseline with no protection at all (loopback only).
        flags=(--insecure-peers)
        if [[ "$mode" != plain ]]; then
            flags=(--cert-file "$certs/node-$id.pem" --key-file "$certs/node-$id-key.pem"
                --peer-cert-file "$certs/node-$id.pem" --peer-key-file "$certs/node-$id-key.pem"
                --peer-ca-file "$certs/ca.pem")
        fi
        "$bin" serve --id "$id" --data-dir "$work/$name/node$id" --listen-client "${client[$id]}" \
            --listen-peer "${peer[$id]}" --initial-cluster "$cluster" "${flags[@]}" \
            2>"$work/$name-node$id.log" &
        pids+=($!)
    done
    for _ in $(seq 100); do
        "$bin" endpoint health --endpoints "$endpoints" "${reach[@]}" >/dev/null 2>&1 && break
        sleep 0.2
    done
    "$bin" endpoint health --endpoints "$endpoints" "${reach[@]}" >/dev/null
    if [[ "$mode" == tls+auth ]]; then
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

# start_etcd NAME MODE (plain | tls: TLS for clients and, both ways, peers).
start_etcd() {
    local name=$1 mode=$2 id cluster="" endpoints="" scheme=http
    local -a client peer flags
    [[ "$mode" == tls ]] && scheme=https
    for id in 1 2 3; do
        client[$id]="127.0.0.1:$(port)"
        peer[$id]="127.0.0.1:$(port)"
        cluster+="${cluster:+,}$name$id=$scheme://${peer[$id]}"
        endpoints+="${endpoints:+,}${client[$id]}"
    done
    mkdir -p "$work/$name"
    for id in 1 2 3; do
        flags=()
        if [[ "$mode" == tls ]]; then
            flags=(--cert-file "$certs/node-$id.pem" --key-file "$certs/node-$id-key.pem"
                --peer-cert-file "$certs/node-$id.pem" --peer-key-file "$certs/node-$id-key.pem"
                --peer-trusted-ca-file "$certs/ca.pem" --peer-client-cert-auth)
        fi
        etcd --name "$name$id" --data-dir "$work/$name/node$id" \
            --listen-client-urls "$scheme://${client[$id]}" --advertise-client-urls "$scheme://${client[$id]}" \
            --listen-peer-urls "$scheme://${peer[$id]}" --initial-advertise-peer-urls "$scheme://${peer[$id]}" \
            --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$name" \
            "${flags[@]}" 2>"$work/$name-node$id.log" &
        pids+=($!)
    done
    python3 - "$scheme" "$certs/ca.pem" "${client[@]}" <<'PY'
import json, ssl, sys, time, urllib.request
scheme, ca = sys.argv[1], sys.argv[2]
context = ssl.create_default_context(cafile=ca) if scheme == "https" else None
deadline = time.time() + 30
for address in sys.argv[3:]:
    while True:
        try:
            with urllib.request.urlopen(f"{scheme}://{address}/health", timeout=1, context=context) as r:
                if json.load(r).get("health") == "true":
                    break
        except Exception:
            pass
        if time.time() > deadline:
            sys.exit(f"etcd at {address} not healthy within 30 s")
        time.sleep(0.2)
PY
    printf -v "endpoints_$name" '%s' "$endpoints"
}

results="$work/results.jsonl"
# run TARGET MODE ENDPOINTS CONCURRENCY ROUND
run() {
    local target=$1 mode=$2 endpoints=$3 concurrency=$4 round=$5 report
    local -a extra=()
    [[ "$mode" != plain ]] && extra=("${tls_client[@]}")
    [[ "$mode" == tls+auth ]] && extra+=(--user bench:bench-pw)
    report=$("$bench_bin" --target "$target" --endpoints "$endpoints" --workload put \
        --mode plain --concurrency "$concurrency" --key-bytes 8 --value-bytes 64 \
        --duration "$duration" --warmup "$warmup" -o json "${extra[@]}")
    printf '{"target":"%s","security":"%s","round":%s,"report":%s}\n' \
        "$target" "$mode" "$round" "$report" >>"$results"
    python3 -c 'import json, sys
r = json.loads(sys.argv[1])
print("  %-6s %-9s x%-3d %8.0f ops/s  p50 %6.2f ms  p99 %6.2f ms  errors %s" % (
    sys.argv[2], sys.argv[3], r["concurrency"], r["throughput_ops"],
    r["p50_ms"], r["p99_ms"], r["errors"] or "none"))' "$report" "$target" "$mode" >&2
}

if ! command -v etcd >/dev/null; then
    echo "etcd not found: install Debian's etcd-server (scripts/setup.sh does, as root)" >&2
    exit 1
fi
start_oncekv oplain plain
start_oncekv otls tls
start_oncekv oauth tls+auth
start_etcd eplain plain
start_etcd etls tls
for round in $(seq "$rounds"); do
    for concurrency in 1 64; do
        run oncekv plain "$endpoints_oplain" "$concurrency" "$round"
        run oncekv tls "$endpoints_otls" "$concurrency" "$round"
        run oncekv tls+auth "$endpoints_oauth" "$concurrency" "$round"
        run etcd plain "$endpoints_eplain" "$concurrency" "$round"
        run etcd tls "$endpoints_etls" "$concurrency" "$round"
    done
    echo "round $round of $rounds done" >&2
done

python3 - "$results" "$out_dir/benchmarks-security.md" "$command_line" "$rounds" "$duration" <<'PY'
import json, statistics, sys, platform, os
rows = [json.loads(line) for line in open(sys.argv[1])]
out, command, rounds, duration = sys.argv[2:6]
def med(target, security, concurrency, field):
    values = [r["report"][field] for r in rows
              if r["target"] == target and r["security"] == security
              and r["report"]["concurrency"] == concurrency]
    return statistics.median(values)
lines = [
    "# The cost of security",
    "",
    f"Measured by `{command}` ({rounds} round(s) of {duration} per configuration, medians), "
    f"on {os.cpu_count()} cores ({platform.machine()}): 3-node clusters on 127.0.0.1, durable "
    "PUTs of 64-byte values to 8-byte keys (plain requests), every configuration measured in "
    "turn each round so machine noise hits all. *TLS*: TLS on the client port and, both ways "
    "(mutual, node certificates of one CA), on the peer port. *TLS + auth*: also users enforced: "
    "every call carries a login token checked against the replicated users, every entry "
    "carries its principal and apply checks the permission. etcd 3.4 (Debian's) with the same "
    "certificates for clients and peers (`--peer-client-cert-auth`); etcd's auth is not "
    "enabled (its users need `etcdctl`, which is not installed here).",
    "",
    "| writers | system | plaintext ops/s | TLS ops/s (ratio) | TLS + auth ops/s (ratio) | p50 / p99 ms: plaintext, TLS, TLS + auth |",
    "|---|---|---|---|---|---|",
]
for c in (1, 64):
    for target, modes in (("oncekv", ("plain", "tls", "tls+auth")), ("etcd", ("plain", "tls"))):
        p = med(target, "plain", c, "throughput_ops")
        cells = [f"{p:.0f}"]
        for mode in modes[1:]:
            v = med(target, mode, c, "throughput_ops")
            cells.append(f"{v:.0f} ({v / p:.2f}x)")
        if len(cells) == 2:
            cells.append("-")
        lat = ", ".join(f"{med(target, m, c, 'p50_ms'):.2f} / {med(target, m, c, 'p99_ms'):.2f}" for m in modes)
        lines.append(f"| {c} | {target} | {cells[0]} | {cells[1]} | {cells[2]} | {lat} |")
lines.append("")
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
PY
