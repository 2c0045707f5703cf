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
# PROXY=haproxy or PROXY=nginx counts that proxy's instructions the same way instead (one
# thread or worker, upstream connections kept alive, as benches/side-by-side.sh configures them):
# the user-space side of the comparison, free of the machine's noise. H2C=1 sends the POST from
# HTTP/2 clients with prior knowledge instead (h2load, CONNS connections of 8 streams; Debian:
# apt-get install -y nghttp2-client); the upstream side stays HTTP/1.1. TLS=1 terminates TLS 1.3
# (an ECDSA P-256 certificate made for the run) at the proxy, kept-alive HTTP/1.1 inside.
#
# SIM=1 also simulates the caches and branch predictors (callgrind's --cache-sim and --branch-sim,
# a 32 KiB L1 for code and one for data, a last-target predictor for indirect jumps; about twice
# as slow) and prints per request what the count of instructions does not show: L1 misses for
# code (I1mr) and data (D1mr, D1mw), conditional and indirect branches (Bc, Bi) and how many were
# mispredicted (Bcm, Bim). A rough cycle estimate weighs each miss and misprediction at 10 and 15
# instructions: where two proxies with close instruction counts still differ in CPU time, this is
# where it shows.
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
sim=()
[ "${SIM:-0}" != 0 ] && sim=(--cache-sim=yes --branch-sim=yes)
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

h2c=${H2C:-} tls=${TLS:-}
scheme=http hap_tls="" ngx_tls="" hf_tls=()
if [ -n "$tls" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
        -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
        -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
    cat "$work/cert.pem" "$work/key.pem" >"$work/both.pem"
    scheme=https
    hap_tls=" ssl crt $work/both.pem ssl-min-ver TLSv1.3 no-tls-tickets"
    ngx_tls=" ssl; ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem; ssl_protocols TLSv1.3; ssl_session_cache off; ssl_session_tickets off"
    hf_tls=(--tls-cert "$work/cert.pem" --tls-key "$work/key.pem")
fi
case ${PROXY:-holdfast} in
haproxy)
    command -v haproxy >/dev/null || { echo "needs haproxy: apt-get install -y haproxy" >&2; exit 1; }
    printf 'global\n  maxconn 8192\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  http-reuse always\nfrontend fe\n  bind 127.0.0.1:%s%s\n  default_backend be\nbackend be\n  server s1 127.0.0.1:%s\n' \
        "$HF" "${h2c:+ proto h2}$hap_tls" "$BACKEND" >"$work/haproxy.cfg"
    valgrind --tool=callgrind "${sim[@]}" --callgrind-out-file="$work/cg.out" \
        haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
    ready="$scheme://127.0.0.1:$HF/mcp"
    ;;
nginx)
    cat >"$work/proxy.conf" <<CONF
daemon off; master_process off; pid $work/proxy.pid; error_log $work/proxy.err warn;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000; http2_max_requests 1000000;
  client_body_temp_path $work; proxy_temp_path $work; fastcgi_temp_path $work;
  uwsgi_temp_path $work; scgi_temp_path $work;
  upstream backend { server 127.0.0.1:$BACKEND; keepalive 128; keepalive_requests 1000000; }
  server { listen 127.0.0.1:$HF${h2c:+ http2}$ngx_tls;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; } } }
CONF
    valgrind --tool=callgrind "${sim[@]}" --callgrind-out-file="$work/cg.out" \
        nginx -p "$work" -c "$work/proxy.conf" >"$work/proxy.log" 2>&1 &
    ready="$scheme://127.0.0.1:$HF/mcp"
    ;;
*)
    [ -x "$HOLDFAST" ] || { echo "no holdfast at $HOLDFAST (cargo build --release)" >&2; exit 1; }
    TOKIO_WORKER_THREADS=1 valgrind --tool=callgrind "${sim[@]}" --callgrind-out-file="$work/cg.out" \
        "$HOLDFAST" --listen "127.0.0.1:$HF" --admin "127.0.0.1:$HF_ADMIN" \
        --upstream "http://127.0.0.1:$BACKEND" "${hf_tls[@]}" >"$work/holdfast.log" 2>&1 &
    ready="http://127.0.0.1:$HF_ADMIN/readyz"
    ;;
esac
cg=$!
pids+=($cg)
for _ in $(seq 1 300); do
    curl -fsk ${h2c:+--http2-prior-knowledge} "$ready" >/dev/null 2>&1 && break
    sleep 0.1
done
url="$scheme://127.0.0.1:$HF/mcp"
# load SECONDS: the POST for that long; the number of requests answered.
load() {
    if [ -n "$h2c" ]; then
        command -v h2load >/dev/null || { echo "needs h2load: apt-get install -y nghttp2-client" >&2; exit 1; }
        [ -f "$work/body.json" ] || printf '{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"echo","arguments":{"text":"%s"}}}' \
            "$(head -c 900 /dev/zero | tr '\0' y)" >"$work/body.json"
        h2load -t1 -c"$conns" -m8 -d "$work/body.json" -H 'content-type: application/json' \
            -H 'accept: application/json, text/event-stream' -H 'mcp-protocol-version: 2025-11-25' \
            -D "$1" "$url" 2>&1 | awk '/^requests:/ { print $8 } /^status codes:/ && $5 + $7 + $9 > 0 { print "errors: " $0 > "/dev/stderr" }'
    else
        wrk -t1 -c"$conns" -d"$1"s -s benches/peers/post.lua "$url" 2>&1 |
            awk '/requests in/ { print $1 } /Non-2xx|Socket errors/ { print "errors: " $0 > "/dev/stderr" }'
    fi
}
load 2 >/dev/null
callgrind_control -z "$cg" >/dev/null
requests=$(load "$secs")
callgrind_control -d "$cg" >/dev/null
# The dump taken after zeroing is the last file callgrind wrote.
dump=$(ls -t "$work"/cg.out* | head -1)
total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }')
echo "requests: $requests"
awk -v t="$total" -v r="$requests" 'BEGIN { printf "instructions per request: %.0f\n", t / r }'
if [ "${SIM:-0}" != 0 ]; then
    # The dump's own header names its events and sums them.
    awk -v r="$requests" '
        /^events:/ { n = split($0, ev, " ") }
        /^summary:/ {
            line = "per request:"
            for (i = 2; i <= n; i++) { v[ev[i]] = $i / r; if (ev[i] !~ /^(ILmr|DLmr|DLmw)$/) line = line sprintf(" %s=%.0f", ev[i], $i / r) }
            print line
            printf "rough cycles per request: %.0f\n", v["Ir"] + 10 * (v["I1mr"] + v["D1mr"] + v["D1mw"]) + 15 * (v["Bcm"] + v["Bim"])
        }' "$dump"
fi
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
