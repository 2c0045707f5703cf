#!/usr/bin/env bash
# Makes pgo/holdfast.profdata, the profile the release binary is built with (.ci/run and the
# Dockerfile: `-Cprofile-use`): builds holdfast instrumented, trains it, merges what it recorded.
#
#   benches/pgo.sh [SECONDS]
#
# Run it after a change to the request path, and after a new Rust version (the profile belongs
# to one LLVM: pgo/made-with records which rustc made it, and tests/it/deploy_image.rs fails
# when the Dockerfile's RUST_VERSION is another one). A profile older than the
# code is not wrong, only weaker: a function whose control flow changed since loses its counts
# and is optimised as without a profile; the build warns for each (`function control flow change
# detected (hash mismatch)`), which is the sign to run this again.
#
# Training: benches/side-by-side.sh with the instrumented holdfast in its `plain`, `tls` and
# (with h2load) `h2c` modes for SECONDS each (default 8), a few hundred SSE streams, then
# `holdfast demo` (held and replayed calls, a router's 404 masked, sessions re-established), so
# the profile sees what a proxy in front of an MCP server mostly does and the outage paths are
# not laid out as never taken. The peers' figures printed on the way mean nothing (the
# instrumented binary is slow). The profile is merged sparse (functions never run are left out:
# 1.9 MB, not 15).
#
# Then the release binary is built with it, with .ci/run's command, and its path printed.
#
# Needs: llvm-profdata of rustc's own LLVM (rustup component add llvm-tools), and what
# side-by-side.sh needs (apt-get install -y nginx haproxy wrk; nghttp2-client for h2c). Building
# with the profile needs neither.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
host=$(rustc -vV | sed -n 's/^host: //p')
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
[ -x "$profdata" ] || { echo "needs llvm-profdata: rustup component add llvm-tools" >&2; exit 1; }
triple="$(uname -m)-unknown-linux-gnu"

data=$PWD/target/pgo-data
rm -rf "$data"
mkdir -p "$data"
# The same flags as the release build, so that the functions recorded are the ones it compiles;
# `--target` keeps the instrumentation off build scripts and proc-macros.
echo "building the instrumented binary (target/pgo-gen)" >&2
RUSTFLAGS="-C target-feature=+crt-static -Cprofile-generate=$data" \
    cargo build --release --locked --quiet --target "$triple" --target-dir target/pgo-gen
trained=$PWD/target/pgo-gen/$triple/release/holdfast

modes=(plain tls)
command -v h2load >/dev/null && modes+=(h2c)
for mode in "${modes[@]}"; do
    echo "training: $mode, $secs s" >&2
    RUNS=1 HOLDFAST=$trained benches/side-by-side.sh "$mode" "$secs" >/dev/null
done
echo "training: 300 SSE streams" >&2
HOLDFAST=$trained benches/side-by-side.sh sse 300 >/dev/null
echo "training: holdfast demo" >&2
"$trained" demo --duration 12 >/dev/null 2>&1

# holdfast writes its profile when it exits (side-by-side stops it with SIGTERM, a clean exit).
ls "$data"/*.profraw >/dev/null 2>&1 || { echo "no profile was written" >&2; exit 1; }
mkdir -p pgo
"$profdata" merge --sparse -o pgo/holdfast.profdata "$data"/*.profraw
{
    rustc -V
    echo "trained on $(git rev-parse --short=12 HEAD) ($(date -u +%F)), $secs s per load"
} > pgo/made-with

echo "building with the profile (.ci/run's release build)" >&2
RUSTFLAGS="-C target-feature=+crt-static -Cprofile-use=$PWD/pgo/holdfast.profdata" \
    cargo build --release --locked --quiet --target "$triple"
echo "$PWD/target/$triple/release/holdfast"
