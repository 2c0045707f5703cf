#!/usr/bin/env bash
# Instructions per proxied request in user space, counted by valgrind's callgrind: a figure that
# does not move with how busy the machine is, for before/after comparisons of one change.
#
#   benches/instructions.sh [SECONDS] [CONNS] [TOP]
#
# Defaults: 10 s of load over 16 connections after a 2 s warm-up; the TOP (15) functions by their
# own instructions per request. The request is benches/peers/post.lua's (a 1 KiB JSON-RPC POST);
# an nginx answers it as the backend. holdfast runs with one tokio worker under callgrind (about
# fifty times slower: the request count is whatever wrk completes).
#
# PROXY=haproxy counts HAProxy's instructions the same way instead (one thread, `http-reuse
# always`, as benches/alternate.sh configures it): the user-space side of the comparison, free of
# the machine's noise.
#
# HOLDFAST=binary picks the holdfast; for the breakdown by function use a build with line tables:
#   CARGO_PROFILE_RELEASE_STRIP=false CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
#     cargo build --release --target-dir target/prof
#   HOLDFAST=target/prof/release/holdfast benches/instructions.sh
# Needs valgrind, nginx, wrk (Debian: apt-get install -y valgrind nginx wrk).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10} conns=${2:-16} top=${3:-15}
for tool in valgrind callgrind_control callgrind_annotate nginx wrk; do
    command -v "$tool" >/dev/null || { echo "needs $tool: apt-get install -y valgrind nginx wrk" >&2; exit 1; }
done
HOLDFAST=${HOLDFAST:-target/release/holdfast}

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${KEEP:-}" ] && cp "$work"/cg.out* "$KEEP"/ 2>/dev/null; rm -rf "$work"
}
trap cleanup EXIT
BACKEND=19411 HF=19412 HF_ADMIN=19413

cat >"$work/backend.conf" <<CONF
daemon off; master_process off; pid $work/backend.pid; error_log $work/backend.err warn;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path $work; proxy_temp_path $work; fastcgi_temp_path $work;
  uwsgi_temp_path $work; scgi_temp_path $work;
  server { listen 127.0.0.1:$BACKEND; client_body_buffer_size 64k;
    location / { default_type application/json;
      return 200 '{"jsonrpc":"2.0","id":11,"result":{"content":[{"type":"text","text":"ok"}]}}'; } } }
CONF
nginx -p "$work" -c "$work/backend.conf" &
pids+=($!)

if [ "${PROXY:-holdfast}" = haproxy ]; then
    command -v haproxy >/dev/null || { echo "needs haproxy: apt-get install -y haproxy" >&2; exit 1; }
    printf 'global\n  maxconn 8192\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  http-reuse always\nfrontend fe\n  bind 127.0.0.1:%s\n  default_backend be\nbackend be\n  server s1 127.0.0.1:%s\n' \
        "$HF" "$BACKEND" >"$work/haproxy.cfg"
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
        haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
    ready="http://127.0.0.1:$HF/mcp"
else
    [ -x "$HOLDFAST" ] || { echo "no holdfast at $HOLDFAST (cargo build --release)" >&2; exit 1; }
    TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
        "$HOLDFAST" --listen "127.0.0.1:$HF" --admin "127.0.0.1:$HF_ADMIN" \
        --upstream "http://127.0.0.1:$BACKEND" >"$work/holdfast.log" 2>&1 &
    ready="http://127.0.0.1:$HF_ADMIN/readyz"
fi
cg=$!
pids+=($cg)
for _ in $(seq 1 300); do
    curl -fs "$ready" >/dev/null 2>&1 && break
    sleep 0.1
done
url="http://127.0.0.1:$HF/mcp"
wrk -t1 -c"$conns" -d2s -s benches/peers/post.lua "$url" >/dev/null 2>&1
callgrind_control -z "$cg" >/dev/null
out=$(wrk -t1 -c"$conns" -d"${secs}s" -s benches/peers/post.lua "$url" 2>&1)
callgrind_control -d "$cg" >/dev/null
requests=$(echo "$out" | awk '/requests in/ { print $1 }')
errors=$(echo "$out" | grep -E 'Non-2xx|Socket errors' || true)
# The dump taken after zeroing is the last file callgrind wrote.
dump=$(ls -t "$work"/cg.out* | head -1)
total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
echo "requests: $requests ${errors:+($errors)}"
awk -v t="$total" -v r="$requests" 'BEGIN { printf "instructions per request: %.0f\n", t / r }'
echo "top functions, own instructions per request:"
# (callgrind_annotate lists the threads' entry points with everything under them first: any
# entry above half of the total is one of those, not a function's own cost.)
callgrind_annotate --inclusive=no --threshold=100 "$dump" 2>/dev/null |
    awk -v r="$requests" -v t="$total" -v top="$top" '
        /^-+$/ { rule++; next }
        rule >= 3 && $1 ~ /^[0-9,]+$/ && n < top {
            ir = $1; gsub(",", "", ir); ir += 0
            if (ir > t / 2) next
            sub(/^[^)]*\) +/, ""); sub(/ \[.*\]$/, "")
            printf "  %8.0f  %s\n", ir / r, substr($0, 1, 120); n++
        }'
