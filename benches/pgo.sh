#!/usr/bin/env bash
# A profile-guided build of holdfast: built instrumented, trained on the benchmark loads, built
# again with what the training recorded.
#
#   benches/pgo.sh [SECONDS]
#
# The binary lands in target/pgo/release/holdfast. Training runs benches/side-by-side.sh with the
# instrumented holdfast in its `plain`, `tls` and (with h2load) `h2c` modes for SECONDS each
# (default 8), and opens a few hundred SSE streams, so the profile sees what a proxy in front of
# an MCP server mostly does; the peers' own figures printed on the way mean nothing (the
# instrumented binary is slow). Paths the training does not take (holding, replays, session
# resumption) stay correct and are laid out as cold code.
#
# Why: the request path is spread over more code than a CPU's instruction cache holds, and the
# profile lets the compiler lay the hot part out together and inline by measured frequency. One
# measured sitting (benches/RESULTS.md, 2026-12-04 fourth session): 18 % fewer instructions, 30 %
# fewer instruction-cache misses and 19 % less CPU per proxied request than the plain release
# build. It is not the default build: the profile belongs to one compiler version and one state
# of the code, so it is made here, at build time, not kept in the repository.
#
# Needs: llvm-profdata of rustc's own LLVM (rustup component add llvm-tools), and what
# side-by-side.sh needs (apt-get install -y nginx haproxy wrk; nghttp2-client for h2c).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
host=$(rustc -vV | sed -n 's/^host: //p')
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
[ -x "$profdata" ] || { echo "needs llvm-profdata: rustup component add llvm-tools" >&2; exit 1; }

data=$PWD/target/pgo-data
rm -rf "$data"
mkdir -p "$data"
echo "building the instrumented binary (target/pgo-gen)" >&2
RUSTFLAGS="-Cprofile-generate=$data" cargo build --release --quiet --target-dir target/pgo-gen
trained=$PWD/target/pgo-gen/release/holdfast

modes=(plain tls)
command -v h2load >/dev/null && modes+=(h2c)
for mode in "${modes[@]}"; do
    echo "training: $mode, $secs s" >&2
    RUNS=1 HOLDFAST=$trained benches/side-by-side.sh "$mode" "$secs" >/dev/null
done
echo "training: 300 SSE streams" >&2
HOLDFAST=$trained benches/side-by-side.sh sse 300 >/dev/null

# holdfast writes its profile when it exits (side-by-side stops it with SIGTERM, a clean exit).
ls "$data"/*.profraw >/dev/null 2>&1 || { echo "no profile was written" >&2; exit 1; }
"$profdata" merge -o "$data/merged.profdata" "$data"/*.profraw
echo "building with the profile (target/pgo)" >&2
RUSTFLAGS="-Cprofile-use=$data/merged.profdata" cargo build --release --quiet --target-dir target/pgo
echo "$PWD/target/pgo/release/holdfast"
