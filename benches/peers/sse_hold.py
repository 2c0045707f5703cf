"""Resident memory per open SSE stream through one proxy.

usage: sse_hold.py STREAMS BACKEND_PORT PROXY_PORT PROXY_PID

Serves as the backend on BACKEND_PORT (every request gets an event stream with one small
progress notification every 5 s), opens STREAMS `GET /mcp` streams through the proxy on
PROXY_PORT, and prints the proxy's resident memory (PROXY_PID and its children: nginx's workers)
before and once every stream has its head, and the growth per stream.
"""

import asyncio
import os
import sys

EVENT = (
    b"event: message\n"
    b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}\n\n'
)


def resident_kib(pid):
    """VmRSS of pid and its direct children, in KiB."""
    pids = [pid] + [int(p) for p in os.popen(f"pgrep -P {pid}").read().split()]
    total = 0
    for p in pids:
        with open(f"/proc/{p}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


async def stream_events(reader, writer):
    """The backend: an event stream that never ends, chunked."""
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
            await writer.drain()
            await asyncio.sleep(5)
    except (ConnectionError, asyncio.IncompleteReadError):
        pass


async def hold_one(port, opened):
    """A client: opens the stream, reads its head and first event, then holds it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /mcp HTTP/1.1\r\nhost: bench\r\naccept: text/event-stream\r\n\r\n")
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    opened.append(writer)
    while await reader.read(65536):
        pass


async def main():
    streams, backend_port, proxy_port, proxy_pid = (int(a) for a in sys.argv[1:5])
    server = await asyncio.start_server(stream_events, "127.0.0.1", backend_port, backlog=4096)
    await asyncio.sleep(1)
    before = resident_kib(proxy_pid)
    opened = []
    _held = [asyncio.create_task(hold_one(proxy_port, opened)) for _ in range(streams)]
    for _ in range(1200):
        if len(opened) >= streams:
            break
        await asyncio.sleep(0.05)
    # Let every first event pass through before measuring.
    await asyncio.sleep(2)
    after = resident_kib(proxy_pid)
    per = (after - before) / max(1, len(opened))
    print(f"streams={len(opened)} rss_before_kib={before} rss_after_kib={after} per_stream_kib={per:.1f}")
    sys.stdout.flush()
    # Every stream and the backend end with the process: the kernel closes their sockets, and
    # nothing else is left to tidy (cancelling thousands of tasks only prints their tracebacks).
    os._exit(0)


if __name__ == "__main__":
    asyncio.run(main())
