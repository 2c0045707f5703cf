#!/usr/bin/env bash
# Two holdfast binaries and HAProxy alternated in one sitting, for before/after comparisons that
# the machine's noise does not swamp: each round runs wrk against HAProxy, then A, then B (the
# setup of benches/side-by-side.sh: wrk and an nginx backend on CPU 0, each proxy alone on CPU 1; a 1 KiB
# JSON-RPC POST over CONNS keep-alive connections), and prints CPU per request split into user
# and system time from /proc, and at the end the medians of the per-round ratios (benches/medians.py).
# Needs nginx, haproxy and wrk (Debian: apt-get install -y nginx haproxy wrk). Not part of .ci/run.
#
# usage: benches/alternate.sh ROUNDS SECONDS CONNS BINARY_A BINARY_B
# (ROUNDS a multiple of 3: the three take turns at going first, second and third)
# (a binary may be a script that sets the environment and execs holdfast)
# TLS=1: the clients speak TLS 1.3 to each proxy (an ECDSA P-256 certificate made for the run,
# HAProxy without tickets, holdfast without resumption; kept alive, so no handshake is counted).
set -u
rounds=$1; secs=$2; conns=$3; A=$4; B=$5
post=$(cd "$(dirname "$0")" && pwd)/peers/post.lua
d=$(mktemp -d); mkdir -p "$d/logs"; pids=()
scheme=http; hap_tls=""; hf_tls=()
if [ "${TLS:-0}" = 1 ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$d/key.pem" -out "$d/cert.pem" 2>/dev/null
  cat "$d/cert.pem" "$d/key.pem" > "$d/both.pem"
  scheme=https; hap_tls=" ssl crt $d/both.pem ssl-min-ver TLSv1.3 no-tls-tickets"
  hf_tls=(--tls-cert "$d/cert.pem" --tls-key "$d/key.pem")
  export HOLDFAST_TLS__SESSION_RESUMPTION=false
fi
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$d"; }
trap cleanup EXIT
BACK=19111; HAP=19113; HA=19114; HB=19116
cat > "$d/back.conf" <<CONF
daemon off; worker_processes 1; pid $d/back.pid; error_log $d/logs/back.log warn;
events { worker_connections 4096; }
http { access_log off; client_body_temp_path $d; proxy_temp_path $d; fastcgi_temp_path $d; uwsgi_temp_path $d; scgi_temp_path $d;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$BACK; client_body_buffer_size 64k;
    location / { default_type application/json; return 200 '{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"ok"}]}}'; } } }
CONF
printf 'global\n  maxconn 8192\n  nbthread 1\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  http-reuse always\nfrontend fe\n  bind 127.0.0.1:%s%s\n  default_backend be\nbackend be\n  server s1 127.0.0.1:%s\n' $HAP "$hap_tls" $BACK > "$d/hap.cfg"
taskset -c 0 nginx -p "$d" -c "$d/back.conf" & pids+=($!)
taskset -c 1 haproxy -f "$d/hap.cfg" & pids+=($!); hp=$!
taskset -c 1 "$A" --listen 127.0.0.1:$HA --upstream http://127.0.0.1:$BACK --admin 127.0.0.1:$((HA + 100)) "${hf_tls[@]}" >"$d/logs/a.log" 2>&1 & pids+=($!); ap=$!
taskset -c 1 "$B" --listen 127.0.0.1:$HB --upstream http://127.0.0.1:$BACK --admin 127.0.0.1:$((HB + 100)) "${hf_tls[@]}" >"$d/logs/b.log" 2>&1 & pids+=($!); bp=$!
# user and system ticks of a process and its children
ticks() { local u=0 s=0 p uu ss; for p in $1 $(pgrep -P "$1"); do read -r uu ss < <(awk '{print $14, $15}' "/proc/$p/stat"); u=$((u + uu)); s=$((s + ss)); done; echo $u $s; }
# TCP segments sent on this machine so far (every hop is on loopback: per request, the same for
# the client and the backend whichever proxy is between, so a difference is the proxy's)
segs() { awk '/^Tcp:/ { if (n++) { for (i = 1; i <= NF; i++) if (name[i] == "OutSegs") print $i } else for (i = 1; i <= NF; i++) name[i] = $i }' /proc/net/snmp; }
hz=$(getconf CLK_TCK); sleep 1
runs=(haproxy:$HAP:$hp a:$HA:$ap b:$HB:$bp)
for r in $(seq "$rounds"); do
  # Each round starts with the next of the three: a run's place in the round moves its figures
  # (the same binary as A and B, always in that order, measured B / A at 0.92 p99 and 1.03
  # req/s over 24 rounds), so each proxy takes each place equally often.
  for i in 0 1 2; do
    t=${runs[$(( (r + i) % 3 ))]}
    IFS=: read -r name port pid <<< "$t"
    taskset -c 0 wrk -t1 -c"$conns" -d1s -s "$post" "$scheme://127.0.0.1:$port/mcp" >/dev/null 2>&1
    read -r u0 s0 < <(ticks "$pid"); g0=$(segs)
    out=$(taskset -c 0 wrk -t1 -c"$conns" -d"${secs}s" --latency -s "$post" "$scheme://127.0.0.1:$port/mcp" 2>&1)
    read -r u1 s1 < <(ticks "$pid"); g1=$(segs)
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p99=$(echo "$out" | awk '$1=="99%" {print $2}')
    p50=$(echo "$out" | awk '$1=="50%" {print $2}')
    awk -v r="$r" -v n="$name" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v hz="$hz" -v q="$reqs" -v rps="$rps" -v p99="$p99" -v p50="$p50" -v g=$((g1 - g0)) \
      'BEGIN { printf "%d %-8s rps=%-9s p99=%-8s user=%.1f sys=%.1f cpu=%.1f segs=%.2f p50=%s\n", r, n, rps, p99, u/hz*1e6/q, s/hz*1e6/q, (u+s)/hz*1e6/q, g/q, p50 }' | tee -a "$d/rows"
  done
done
# The medians of the per-round ratios (each round's B / A, A / HAProxy, B / HAProxy).
python3 "$(dirname "$0")/medians.py" < "$d/rows"
