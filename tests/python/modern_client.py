"""The official MCP Python SDK's client pinned to the final 2026-07-28 revision, as a test peer
for holdfast's era bridge (tests/it/era_bridge.rs).

Usage: python modern_client.py URL OP...
  OP: list | call:NAME:JSONARGS | wait

A pinned client sends no `server/discover` and no handshake: every request carries the revision
in its headers and `_meta`. Prints `era <version>` once connected (or `connect-failed <error>`),
then one line per op: `ok <op> <summary>` or `err <op> <error>`; `wait` prints `waiting` and
reads one line from stdin before it goes on (the test restarts the server meanwhile).
"""

import asyncio
import json
import sys

from mcp import Client


async def run(client: Client, op: str) -> str:
    kind, _, rest = op.partition(":")
    if kind == "list":
        listed = await client.list_tools()
        return ",".join(sorted(tool.name for tool in listed.tools))
    if kind == "call":
        name, _, args = rest.partition(":")
        result = await client.call_tool(name, json.loads(args or "{}"))
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        return ("error " if result.is_error else "") + text
    raise ValueError(f"unknown op {op!r}")


async def main() -> None:
    url, ops = sys.argv[1], sys.argv[2:]
    try:
        async with Client(url, mode="2026-07-28") as client:
            print("era", client.protocol_version, flush=True)
            for op in ops:
                if op == "wait":
                    print("waiting", flush=True)
                    await asyncio.to_thread(sys.stdin.readline)
                    continue
                try:
                    print("ok", op, await run(client, op), flush=True)
                except Exception as error:  # every failure is the test's to see
                    print("err", op, repr(error).replace("\n", " "), flush=True)
    except Exception as error:
        print("connect-failed", repr(error).replace("\n", " "), flush=True)


asyncio.run(main())
