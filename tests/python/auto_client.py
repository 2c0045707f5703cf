"""The official MCP Python SDK's client in its default `mode="auto"`, as a test peer for holdfast
(tests/it/dual_era.rs).

Usage: python auto_client.py URL N

Connects as a dual-era client does (`server/discover` first; the 2025 handshake on any HTTP 4xx
without a JSON-RPC body), prints `era <version>` (or `connect-failed <error>`), then calls the
ledger server's `lookup` tool with n = 0..N-1, printing `ok <n> <text>` or `err <n> <error>` for
each.
"""

import asyncio
import sys

from mcp import Client


async def main() -> None:
    url, calls = sys.argv[1], int(sys.argv[2])
    try:
        async with Client(url) as client:
            print("era", client.protocol_version, flush=True)
            for n in range(calls):
                try:
                    result = await client.call_tool("lookup", {"n": n})
                    print("ok", n, result.content[0].text, flush=True)
                except Exception as error:  # every failure is the test's to see
                    print("err", n, repr(error), flush=True)
    except Exception as error:
        print("connect-failed", repr(error).replace("\n", " "), flush=True)


asyncio.run(main())
