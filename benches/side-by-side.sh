#!/usr/bin/env bash
# holdfast beside nginx and HAProxy in one run, using nothing from outside this repository.
#
#   benches/side-by-side.sh plain [SECONDS] [CONNS]              1 KiB JSON-RPC POST, kept alive
#   benches/side-by-side.sh tls   [SECONDS] [CONNS] [keepalive|close]
#                                                                 the same, TLS 1.3 (ECDSA P-256)
#                                                                 terminated at each proxy
#   benches/side-by-side.sh resume [SECONDS]                     TLS 1.3 with resumption on every
#                                                                 side: CPU per resumed connection,
#                                                                 then per full one (openssl s_time)
#   benches/side-by-side.sh h2c   [SECONDS] [CONNS] [STREAMS]    the same POST from HTTP/2 clients
#                                                                 (prior knowledge), STREAMS each
#   benches/side-by-side.sh h2    [SECONDS] [CONNS] [STREAMS]    the same over TLS 1.3 (ALPN h2)
#   benches/side-by-side.sh sse   [STREAMS]                      resident memory per open SSE stream
#   benches/side-by-side.sh syscalls [SECONDS] [CONNS] [plain|tls]
#                                                                 system calls and page faults per
#                                                                 request of each proxy (strace -c;
#                                                                 kept alive; needs strace)
#
# Defaults: plain 6 s, 64 connections; tls keepalive; h2c and h2 8 connections of 8 streams
# (64 in flight); sse 3000 streams. RUNS=n repeats plain, tls, h2c and h2. HOLDFAST=binary picks the holdfast (default: target/release/holdfast, built first).
#
# Setup: one nginx as the backend and wrk share CPU 0; each proxy runs alone on CPU 1, one
# worker/thread each. CPU per request is the proxy's user+system time (from /proc, its children
# included) over the requests wrk completed: the figure to compare, since it does not depend on
# how busy the rest of the machine is. Compare ratios within one run, never absolute numbers
# across runs (the machine is shared and noisy); benches/RESULTS.md has the last results.
#
# TLS: session resumption is off on every side (nginx and HAProxy: no session cache, no tickets;
# holdfast: tls.session_resumption = false), so with `close` (wrk opens a new connection per
# request) every request is a full handshake on each proxy alike.
#
# HTTP/2: h2load (nghttp2) is the client; the upstream side stays HTTP/1.1 kept alive for every
# proxy. p50/p99 are not printed by h2load: the mean time per request is.
#
# Needs nginx, haproxy, wrk, openssl, python3, and h2load for h2c/h2 (Debian: apt-get install -y
# nginx haproxy wrk nghttp2-client).
# Not part of .ci/run: timings on a shared machine are not test results.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD/benches/peers
mode=${1:-plain}
for tool in nginx haproxy wrk openssl python3 taskset; do
    command -v "$tool" >/dev/null || { echo "needs $tool: apt-get install -y nginx haproxy wrk" >&2; exit 1; }
done
if [ -z "${HOLDFAST:-}" ]; then
    cargo build --release --quiet
    HOLDFAST=$PWD/target/release/holdfast
fi

# Thousands of streams need as many descriptors in each peer.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

work=$(mktemp -d)
mkdir -p "$work/logs"
started=()
cleanup() {
    for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# Ports: the backend, then one per proxy.
BACKEND=19401 NGINX=19402 HAPROXY=19403 HF=19404 HF_ADMIN=19405

# nginx's common http-block settings: no logs, temp files in the work directory.
nginx_http() {
    echo "access_log off; keepalive_requests 1000000;"
    for t in client_body proxy fastcgi uwsgi scgi; do echo "${t}_temp_path $work;"; done
}

# start NAME CPU COMMAND...: runs a peer pinned to CPU, remembers its pid in pid_NAME.
start() {
    local name=$1 cpu=$2
    shift 2
    taskset -c "$cpu" "$@" >"$work/logs/$name.log" 2>&1 &
    started+=($!)
    printf -v "pid_$name" '%s' $!
}

# The backend: nginx answering every request with a small JSON-RPC result.
backend() {
    cat >"$work/backend.conf" <<CONF
daemon off; master_process off; pid $work/backend.pid; error_log $work/logs/backend.err warn;
events { worker_connections 8192; }
http { $(nginx_http)
  server { listen 127.0.0.1:$BACKEND; client_body_buffer_size 64k;
    location / { default_type application/json;
      return 200 '{"jsonrpc":"2.0","id":11,"result":{"content":[{"type":"text","text":"ok"}]}}'; } } }
CONF
    start backend 0 nginx -p "$work" -c "$work/backend.conf"
}

# A self-signed ECDSA P-256 certificate for 127.0.0.1, and HAProxy's certificate-and-key file.
certificate() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
        -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
        -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
    cat "$work/cert.pem" "$work/key.pem" >"$work/both.pem"
}

# The three proxies in front of the backend: plain HTTP/1 by default; $1 `tls` (HTTP/1.1 over
# TLS), `h2c` (HTTP/2 with prior knowledge) or `h2` (HTTP/2 over TLS, ALPN).
proxies() {
    local kind=${1:-}
    local ngx_listen="listen 127.0.0.1:$NGINX;" hap_bind="bind 127.0.0.1:$HAPROXY" hap_global=""
    local hf_tls=() ngx_tls="ssl; ssl_certificate $work/cert.pem;
          ssl_certificate_key $work/key.pem; ssl_protocols TLSv1.3;
          ssl_session_cache off; ssl_session_tickets off;"
    local hap_tls="ssl crt $work/both.pem ssl-min-ver TLSv1.3 no-tls-tickets"
    local hf_resumption=false
    case $kind in
    tls | h2)
        hap_global="  tune.ssl.cachesize 0"
        hf_tls=(--tls-cert "$work/cert.pem" --tls-key "$work/key.pem")
        ;;
    resume)
        # Resumption on every side: a session cache and TLS 1.3 tickets (each one's default
        # cache size; nginx has none unless given one).
        hf_tls=(--tls-cert "$work/cert.pem" --tls-key "$work/key.pem")
        hf_resumption=true
        ngx_tls="ssl; ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem;
          ssl_protocols TLSv1.3; ssl_session_cache shared:SSL:10m; ssl_session_tickets on;"
        hap_tls="ssl crt $work/both.pem ssl-min-ver TLSv1.3"
        ;;
    esac
    case $kind in
    tls | resume)
        ngx_listen="listen 127.0.0.1:$NGINX $ngx_tls"
        hap_bind="$hap_bind $hap_tls"
        ;;
    h2c)
        ngx_listen="listen 127.0.0.1:$NGINX http2;"
        hap_bind="$hap_bind proto h2"
        ;;
    h2)
        ngx_listen="listen 127.0.0.1:$NGINX http2 $ngx_tls"
        hap_bind="$hap_bind $hap_tls alpn h2,http/1.1"
        ;;
    esac
    cat >"$work/nginx.conf" <<CONF
daemon off; master_process off; pid $work/nginx.pid; error_log $work/logs/nginx.err warn;
events { worker_connections 8192; }
http { $(nginx_http)
  upstream backend { server 127.0.0.1:$BACKEND; keepalive 128; keepalive_requests 1000000; }
  server { $ngx_listen
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_read_timeout 1h; } } }
CONF
    cat >"$work/haproxy.cfg" <<CONF
global
  maxconn 9000
  nbthread 1
$hap_global
defaults
  mode http
  timeout connect 1s
  timeout client 1h
  timeout server 1h
  http-reuse always
frontend front
  $hap_bind
  default_backend back
backend back
  server backend 127.0.0.1:$BACKEND
CONF
    start nginx 1 nginx -p "$work" -c "$work/nginx.conf"
    start haproxy 1 haproxy -f "$work/haproxy.cfg"
    start holdfast 1 env HOLDFAST_TLS__SESSION_RESUMPTION=$hf_resumption "$HOLDFAST" --listen "127.0.0.1:$HF" --admin "127.0.0.1:$HF_ADMIN" \
        --upstream "http://127.0.0.1:$BACKEND" "${hf_tls[@]}"
    sleep 1
}

# stat_sum PID AWK_EXPR: the sum of a /proc/PID/stat expression over a process and its children.
stat_sum() {
    local total=0 pid
    for pid in "$1" $(pgrep -P "$1" || true); do
        total=$((total + $(awk "{ print $2 }" "/proc/$pid/stat")))
    done
    echo "$total"
}

# CPU ticks (user+system) of a process and its children.
ticks() { stat_sum "$1" '$14 + $15'; }

# Minor page faults of a process and its children (each one the kernel's time, no system call).
minflt() { stat_sum "$1" '$10'; }

# measure NAME PORT SCHEME SECONDS CONNS SCRIPT: one wrk run against a proxy, one line out.
measure() {
    local name=$1 port=$2 scheme=$3 secs=$4 conns=$5 script=$6
    local pid_var="pid_$name" url="$scheme://127.0.0.1:$port/mcp"
    local pid=${!pid_var}
    taskset -c 0 wrk -t1 -c"$conns" -d1s -s "$script" "$url" >/dev/null 2>&1 || true
    local before after out
    before=$(ticks "$pid")
    out=$(taskset -c 0 wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$script" "$url" 2>&1)
    after=$(ticks "$pid")
    echo "$out" | awk -v name="$name" -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
        /requests in/ { requests = $1 }
        /Requests\/sec/ { rps = $2 }
        $1 == "50%" { p50 = $2 }
        $1 == "99%" { p99 = $2 }
        /Non-2xx|Socket errors/ { errors = errors " " $0 }
        END {
            printf "%-9s cpu_us_per_req=%-7.1f rps=%-10s p50=%-9s p99=%-9s%s\n",
                name, ticks / hz * 1e6 / (requests ? requests : 1), rps, p50, p99, errors
        }'
}

# measure_h2 NAME PORT SCHEME SECONDS CONNS STREAMS: one h2load run against a proxy, one line.
measure_h2() {
    local name=$1 port=$2 scheme=$3 secs=$4 conns=$5 streams=$6
    local pid_var="pid_$name" url="$scheme://127.0.0.1:$port/mcp"
    local pid=${!pid_var}
    local load=(h2load -t1 -c"$conns" -m"$streams" -d "$work/body.json"
        -H 'content-type: application/json' -H 'accept: application/json, text/event-stream'
        -H 'mcp-protocol-version: 2025-11-25')
    taskset -c 0 "${load[@]}" -D 1 "$url" >/dev/null 2>&1 || true
    local before after out
    before=$(ticks "$pid")
    out=$(taskset -c 0 "${load[@]}" -D "$secs" "$url" 2>&1)
    after=$(ticks "$pid")
    echo "$out" | awk -v name="$name" -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
        /^finished in/ { rps = $4 }
        /^requests:/ { done = $8; failed = $10; errored = $12 }
        /^status codes:/ { ok = $3 }
        /^time for request:/ { mean = $6 }
        END {
            printf "%-9s cpu_us_per_req=%-7.1f rps=%-10s mean=%-9s 2xx=%s failed=%s errored=%s\n",
                name, ticks / hz * 1e6 / (done ? done : 1), rps, mean, ok, failed, errored
        }'
}

# measure_handshakes NAME PORT SECONDS HOW: `openssl s_time` against a proxy, one connection at a
# time, each an HTTP/1.0 GET and a close; HOW is -reuse (every connection resumes the first
# one's session) or -new (a full handshake each). One line: CPU per connection.
measure_handshakes() {
    local name=$1 port=$2 secs=$3 how=$4
    local pid_var="pid_$name"
    local pid=${!pid_var}
    local load=(openssl s_time -connect "127.0.0.1:$port" "$how" -www /mcp)
    taskset -c 0 "${load[@]}" -time 1 >/dev/null 2>&1 || true
    local before after out
    before=$(ticks "$pid")
    out=$(taskset -c 0 "${load[@]}" -time "$secs" 2>&1)
    after=$(ticks "$pid")
    echo "$out" | awk -v name="$name" -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" -v how="$how" '
        /connections in .* real seconds/ { n = $1 }
        END {
            printf "%-9s %s cpu_us_per_conn=%-7.1f connections=%s\n",
                name, how, ticks / hz * 1e6 / (n ? n : 1), n
        }'
}

# rounds SCHEME SECONDS CONNS SCRIPT: every proxy once per run, then holdfast's ratio to HAProxy.
# With MEASURE=measure_h2, SCRIPT is the streams per connection.
rounds() {
    local run lines
    for run in $(seq 1 "${RUNS:-1}"); do
        lines=$(for name in nginx haproxy holdfast; do
            local port_var=${name^^}
            [ "$name" = holdfast ] && port_var=HF
            "${MEASURE:-measure}" "$name" "${!port_var}" "$@"
        done)
        echo "$lines"
        echo "$lines" | awk '{ split($2, a, "="); cpu[$1] = a[2] }
            END { printf "holdfast / haproxy CPU per request: %.2f   (nginx / haproxy: %.2f)\n",
                  cpu["holdfast"] / cpu["haproxy"], cpu["nginx"] / cpu["haproxy"] }'
    done
}

# syscalls NAME PORT SECONDS CONNS SCHEME: the proxy's system calls per request under strace -c
# (slow: the counts are the figure, not the rate).
syscalls() {
    local name=$1 port=$2 secs=$3 conns=$4 scheme=$5
    local pid_var="pid_$name" url="$scheme://127.0.0.1:$port/mcp"
    local pid=${!pid_var}
    strace -c -f -p "$pid" -o "$work/$name.strace" 2>/dev/null &
    local tracer=$!
    sleep 1
    local out faults_before faults_after
    faults_before=$(minflt "$pid")
    out=$(taskset -c 0 wrk -t1 -c"$conns" -d"${secs}s" -s "$here/post.lua" "$url" 2>&1)
    faults_after=$(minflt "$pid")
    kill -INT "$tracer"
    wait "$tracer" 2>/dev/null || true
    local requests
    requests=$(echo "$out" | awk '/requests in/ { print $1 }')
    awk -v name="$name" -v n="$requests" -v faults=$((faults_after - faults_before)) '
        $1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" { calls[$NF] = $4; total += $4 }
        END {
            printf "%-9s %d requests, %.3f page faults and %.2f system calls per request:", name, n, faults / n, total / n
            for (c in calls) if (calls[c] / n >= 0.01) printf " %s=%.2f", c, calls[c] / n
            printf "\n"
        }' "$work/$name.strace"
}

case $mode in
syscalls)
    command -v strace >/dev/null || { echo "needs strace: apt-get install -y strace" >&2; exit 1; }
    scheme=http
    if [ "${4:-plain}" = tls ]; then
        certificate
        scheme=https
    fi
    backend
    proxies "${4:-}"
    for name in nginx haproxy holdfast; do
        port_var=${name^^}
        [ "$name" = holdfast ] && port_var=HF
        syscalls "$name" "${!port_var}" "${2:-3}" "${3:-64}" "$scheme"
    done
    ;;
plain)
    backend
    proxies
    rounds http "${2:-6}" "${3:-64}" "$here/post.lua"
    ;;
tls)
    certificate
    backend
    proxies tls
    script=$here/post.lua
    if [ "${4:-keepalive}" = close ]; then
        script=$here/close.lua
        export BENCH_POST_LUA=$here/post.lua
    fi
    rounds https "${2:-6}" "${3:-64}" "$script"
    ;;
resume)
    # Resumed handshakes (and, for comparison, full ones) with resumption on everywhere.
    certificate
    backend
    proxies resume
    for how in -reuse -new; do
        for run in $(seq 1 "${RUNS:-1}"); do
            lines=$(for name in nginx haproxy holdfast; do
                port_var=${name^^}
                [ "$name" = holdfast ] && port_var=HF
                measure_handshakes "$name" "${!port_var}" "${2:-6}" "$how"
            done)
            echo "$lines"
            echo "$lines" | awk -v how="$how" '{ split($3, a, "="); cpu[$1] = a[2] }
                END { printf "%s holdfast / haproxy CPU per connection: %.2f   (nginx / haproxy: %.2f)\n",
                      how, cpu["holdfast"] / cpu["haproxy"], cpu["nginx"] / cpu["haproxy"] }'
        done
    done
    ;;
h2c | h2)
    [ "$mode" = h2 ] && certificate
    command -v h2load >/dev/null || { echo "needs h2load: apt-get install -y nghttp2-client" >&2; exit 1; }
    # The body of benches/peers/post.lua's request.
    printf '{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"echo","arguments":{"text":"%s"}}}' \
        "$(head -c 900 /dev/zero | tr '\0' y)" >"$work/body.json"
    backend
    proxies "$mode"
    scheme=http
    [ "$mode" = h2 ] && scheme=https
    MEASURE=measure_h2 rounds "$scheme" "${2:-6}" "${3:-8}" "${4:-8}"
    ;;
sse)
    streams=${2:-3000}
    proxies
    for name in nginx haproxy holdfast; do
        port_var=${name^^}
        [ "$name" = holdfast ] && port_var=HF
        pid_var="pid_$name"
        printf '%-9s ' "$name"
        python3 "$here/sse_hold.py" "$streams" "$BACKEND" "${!port_var}" "${!pid_var}"
    done
    ;;
*)
    sed -n '2,/^#$/p' "$0" >&2
    exit 2
    ;;
esac
