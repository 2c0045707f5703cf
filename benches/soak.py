#!/usr/bin/env python3
"""Soak: holdfast under mixed traffic while its backend is recreated every 10 s.

    cargo build --release && python3 benches/soak.py --minutes 60

Runs the release binary in front of a small HTTP/1.1 backend (a separate process, killed and
started again every --restart-secs, as a container recreation does), and drives it with
--posters clients sending JSON-RPC POSTs back to back on keep-alive connections and --streams
clients holding SSE streams open (reconnecting when one ends). Every minute it prints holdfast's
resident memory and open descriptors (the highest of a sample a second), and the answers seen.
It fails (exit 1) if either grows after --warmup-minutes: the last minute's figure above the
warm-up's highest by more than --rss-slack-kib or --fd-slack; if holdfast exits; or if any
client is answered 404 (the one answer holdfast exists to keep from clients). Not part of CI: it takes as long as you ask.

Standard library only, so it runs wherever python3 does.
"""

import argparse
import asyncio
import collections
import os
import resource
import signal
import socket
import subprocess
import sys
import time

BACKEND = r'''
import asyncio, sys
SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
       b"Transfer-Encoding: chunked\r\n\r\n")
async def serve(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await r.readexactly(length) if length else b""
            if head.startswith(b"GET"):
                w.write(SSE)
                n = 0
                while True:
                    n += 1
                    event = b"event: message\r\ndata: {\"n\":%d}\r\n\r\n" % n
                    # Chunked, as servers send SSE: a killed backend cuts the stream instead
                    # of ending it cleanly (as a response delimited by the close would).
                    w.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await w.drain()
                    await asyncio.sleep(0.1)
            out = b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(out) + out)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), reuse_address=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
'''

POST = (
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":{}}}'
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Backend:
    """The MCP server's container: killed and started again, on the same port."""

    def __init__(self, port):
        self.port = port
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-c", BACKEND, str(self.port)])

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status, b"connection: close" in head.lower()


async def poster(listen, counts, stop, pause):
    request = (
        b"POST /mcp HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nMcp-Session-Id: s1\r\n"
        b"Content-Length: %d\r\n\r\n" % len(POST) + POST
    )
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listen)
            while not stop.is_set():
                writer.write(request)
                status, close = await asyncio.wait_for(read_response(reader), 60)
                counts[status] += 1
                if close:
                    break
                if pause:
                    await asyncio.sleep(pause)
            writer.close()
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
            counts[type(e).__name__] += 1
            await asyncio.sleep(0.1)


async def streamer(listen, counts, stop):
    request = b"GET /mcp HTTP/1.1\r\nHost: soak\r\nAccept: text/event-stream\r\nMcp-Session-Id: s1\r\n\r\n"
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listen)
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            status = head.split(b" ", 2)[1].decode()
            counts["stream " + status] += 1
            if status != "200":
                # A 503 while the backend is away: try again, as a client would.
                writer.close()
                await asyncio.sleep(0.2)
                continue
            while not stop.is_set():
                line = await asyncio.wait_for(reader.readline(), 30)
                if not line:
                    counts["stream cut"] += 1
                    break
                if line == b"0\r\n":
                    counts["stream ended"] += 1
                    break
                if line.startswith(b"data:"):
                    counts["events"] += 1
            writer.close()
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
            counts["stream " + type(e).__name__] += 1
        await asyncio.sleep(0.2)


async def restarts(backend, every, stop):
    while not stop.is_set():
        await asyncio.sleep(every)
        backend.kill()
        await asyncio.sleep(1.0)
        backend.start()


async def run(args):
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1:] * 2)
    backend = Backend(free_port())
    backend.start()
    listen, admin = free_port(), free_port()
    proxy = subprocess.Popen(
        [
            args.binary,
            "--upstream",
            f"http://127.0.0.1:{backend.port}",
            "--listen",
            f"127.0.0.1:{listen}",
            "--admin",
            f"127.0.0.1:{admin}",
        ],
        env={"RUST_LOG": "warn", "HOLDFAST_ROUTES__BEHIND_ROUTER": "false"},
    )
    await asyncio.sleep(1.0)
    counts = collections.Counter()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(poster(listen, counts, stop, args.pause_ms / 1000)) for _ in range(args.posters)]
    tasks += [asyncio.create_task(streamer(listen, counts, stop)) for _ in range(args.streams)]
    tasks.append(asyncio.create_task(restarts(backend, args.restart_secs, stop)))
    warm_rss = warm_fds = 0
    failed = []
    try:
        for minute in range(1, args.minutes + 1):
            # The highest of 60 samples: a minute spans several restarts, so every phase of
            # one (streams reconnecting, requests held) is in each minute's figure alike.
            rss = fds = 0
            for _ in range(60):
                await asyncio.sleep(1)
                if proxy.poll() is not None:
                    break
                rss = max(rss, proc_status(proxy.pid, "VmRSS"))
                fds = max(fds, open_fds(proxy.pid))
            if proxy.poll() is not None:
                failed.append(f"holdfast exited with {proxy.returncode}")
                break
            seen = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=str))
            print(f"minute {minute:3}: rss {rss} KiB, fds {fds}; {seen}", flush=True)
            if minute <= args.warmup_minutes:
                warm_rss, warm_fds = max(warm_rss, rss), max(warm_fds, fds)
            elif minute == args.minutes:
                if rss > warm_rss + args.rss_slack_kib:
                    failed.append(f"rss grew: {rss} KiB after warm-up's {warm_rss} KiB")
                if fds > warm_fds + args.fd_slack:
                    failed.append(f"descriptors grew: {fds} after warm-up's {warm_fds}")
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        proxy.send_signal(signal.SIGTERM)
        proxy.wait()
        backend.kill()
    if counts[404]:
        failed.append(f"{counts[404]} requests answered 404")
    for f in failed:
        print("FAIL:", f)
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=int, default=60)
    p.add_argument("--warmup-minutes", type=int, default=5)
    p.add_argument("--binary", default="target/release/holdfast")
    p.add_argument("--posters", type=int, default=16)
    p.add_argument("--pause-ms", type=float, default=0.0, help="between one poster's requests")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--restart-secs", type=float, default=10.0)
    p.add_argument("--rss-slack-kib", type=int, default=4096)
    p.add_argument("--fd-slack", type=int, default=16)
    args = p.parse_args()
    if args.minutes <= args.warmup_minutes:
        p.error("--minutes must be above --warmup-minutes")
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
