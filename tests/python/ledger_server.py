"""The official MCP Python SDK's stateful Streamable HTTP server under uvicorn, as a test peer
for holdfast (tests/it/support/python.rs).

Usage: python ledger_server.py PORT LEDGER

Two tools, each writing one line `<tool> <n> <pid> <unix time>` to LEDGER when it runs, so a test
can tell which calls ran, how often, in which server process and when:
- `record`: announced with no annotations (not safe to run twice);
- `lookup`: announced `readOnlyHint` and `idempotentHint` (safe to run twice).

SIGTERM gives uvicorn's graceful shutdown: it stops accepting, lets open connections finish and
exits; sse-starlette ends every open event stream at once, a POST's included.
"""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

port = int(sys.argv[1])
ledger = sys.argv[2]
server = MCPServer("holdfast-ledger")


def note(tool: str, n: int) -> str:
    with open(ledger, "a") as f:
        f.write(f"{tool} {n} {os.getpid()} {time.time():.3f}\n")
    return f"{tool} {n}"


@server.tool()
def record(n: int) -> str:
    """Records call n."""
    return note("record", n)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def lookup(n: int) -> str:
    """Looks n up (and records that it did)."""
    return note("lookup", n)


server.run("streamable-http", host="127.0.0.1", port=port, stateless_http=False)
