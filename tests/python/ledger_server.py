"""The official MCP Python SDK's stateful Streamable HTTP server under uvicorn, as a test peer
for holdfast (tests/it/support/python.rs).

Usage: python ledger_server.py PORT LEDGER

Tools and a resource, each writing one line `<kind> <n> <pid> <unix time>` to LEDGER when it
runs, so a test can tell which calls ran, how often, in which server process and when:
- `record`: announced with no annotations (not safe to run twice);
- `lookup`: announced `readOnlyHint` and `idempotentHint` (safe to run twice);
- `peek`: announced `readOnlyHint` only; `put`: announced `idempotentHint` only;
- the resource `ledger://{n}` (kind `read`): `resources/read` is a read-only method.

A test that writes a kind into `LEDGER.die` kills the server the instant it gets the next call of
that kind: the file is removed and the process SIGKILLs itself before the call runs.

SIGTERM gives uvicorn's graceful shutdown: it stops accepting, lets open connections finish and
exits; sse-starlette ends every open event stream at once, a POST's included.

A deploy: a test that writes `LEDGER.release` before a start makes that process the next version
of the server, one change a line: `version=V` (serverInfo.version), `instructions=TEXT`, `extra`
(one tool more, `extra`), `no-peek` (the tool `peek` gone), `put-schema` (`put` takes a second
argument), `protocol=V` (the 2025 handshake's versions after V are no longer spoken: a client that
agreed on a later one is answered V). Without the file: version 1.0, no instructions, the tools
above, every handshake version the SDK speaks.
"""

import os
import signal
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

port = int(sys.argv[1])
ledger = sys.argv[2]


def release() -> dict[str, str]:
    """The changes `LEDGER.release` asks of this version, by name (value or "")."""
    try:
        with open(ledger + ".release") as f:
            lines = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return {}
    return dict((line.split("=", 1) + [""])[:2] for line in lines)


changes = release()
if "protocol" in changes:
    # The SDK reads these module globals per request: what an older SDK release would speak.
    import mcp.server.runner as runner
    import mcp.server.streamable_http_manager as manager

    spoken = tuple(v for v in runner.HANDSHAKE_PROTOCOL_VERSIONS if v <= changes["protocol"])
    runner.HANDSHAKE_PROTOCOL_VERSIONS = spoken
    runner.LATEST_HANDSHAKE_VERSION = changes["protocol"]
    manager.HANDSHAKE_PROTOCOL_VERSIONS = spoken
server = MCPServer(
    "holdfast-ledger",
    instructions=changes.get("instructions"),
    version=changes.get("version", "1.0"),
)


def die_if_asked(kind: str) -> None:
    """SIGKILLs this process if the test asked to die at the next call of `kind`."""
    die_file = ledger + ".die"
    try:
        with open(die_file) as f:
            wanted = f.read().strip()
    except FileNotFoundError:
        return
    if wanted == kind:
        os.remove(die_file)
        os.kill(os.getpid(), signal.SIGKILL)


def note(tool: str, n: int) -> str:
    die_if_asked(tool)
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


if "no-peek" not in changes:

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def peek(n: int) -> str:
        """Peeks at n (and records that it did)."""
        return note("peek", n)


if "put-schema" in changes:

    @server.tool(annotations=ToolAnnotations(idempotentHint=True))
    def put(n: int, note_text: str = "") -> str:
        """Puts n (and records that it did)."""
        return note("put", n)

else:

    @server.tool(annotations=ToolAnnotations(idempotentHint=True))
    def put(n: int) -> str:
        """Puts n (and records that it did)."""
        return note("put", n)


if "extra" in changes:

    @server.tool()
    def extra(n: int) -> str:
        """The next version's new tool (records that it ran)."""
        return note("extra", n)


@server.resource("ledger://{n}")
def read(n: str) -> str:
    """Reads entry n (and records that it did)."""
    return note("read", int(n))


server.run("streamable-http", host="127.0.0.1", port=port, stateless_http=False)
