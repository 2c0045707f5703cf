#!/usr/bin/env bash
# holdfast next to nginx and HAProxy in one run, with the shared benchmarks in ../shared/bench/:
# CPU per request, throughput and p99 for a 1 KiB JSON-RPC POST, then resident memory per open
# SSE stream. Needs nginx, haproxy and wrk (Debian: apt-get install -y nginx haproxy wrk).
# Not part of .ci/run: timings on a shared machine are not test results.
#
# usage: benches/side-by-side.sh [RUNS] [SSE_STREAMS]    (defaults: 3 runs, 2000 streams)
# Compare ratios within one run (holdfast's CPU per request over HAProxy's), never absolute
# numbers across runs: the machine is shared and noisy. benches/RESULTS.md has the last results.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
streams=${2:-2000}
bench=${HOLDFAST_SHARED_BENCH:-../shared/bench}
for tool in nginx haproxy wrk; do
    command -v "$tool" >/dev/null || { echo "needs $tool: apt-get install -y nginx haproxy wrk" >&2; exit 1; }
done
cargo build --release --quiet
bin=$PWD/target/release/holdfast
for run in $(seq 1 "$runs"); do
    echo "run $run"
    HOLDFAST=$bin "$bench/proxy-bench.sh" 6 64 | grep -E '^(nginx|haproxy|holdfast)' |
        awk '{ print } $1 == "haproxy" { split($5, a, "="); hap = a[2] } $1 == "holdfast" { split($5, a, "="); printf "  holdfast / haproxy CPU per request: %.2f\n", a[2] / hap }'
done
HOLDFAST=$bin "$bench/sse-bench.sh" "$streams"
