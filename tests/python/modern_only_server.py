"""A server of the 2026-07-28 revision only, for holdfast's era bridge (tests/it/era_bridge.rs):
the official Python SDK's MCPServer (mcp 2.3.0) with its handshake path cut off.

mcp 2.3.0 has no setting for this: its StreamableHTTPSessionManager sends a request to the
modern (stateless) entry only when MCP-Protocol-Version names a revision without the handshake,
and everything else (an initialize carries no such header) to the 2025 session path. Here every
request goes to the modern entry (handle_modern_request), which refuses initialize, answers
GET and DELETE with 405 and ignores Mcp-Session-Id, as the 2026-07-28 transport says a server
of that revision only does.

Usage: python modern_only_server.py PORT LEDGER
Tools: echo(text) returns text; lookup(n) appends `lookup <n> <pid> <time>` to LEDGER (the
ledger format of ledger_server.py) and returns `lookup <n>`; region(region, q) returns
`<q>@<region>`, its `region` marked `x-mcp-header: Region` (a request must mirror it in
`Mcp-Param-Region`, or the server refuses it); log() sends a log message at debug, info,
warning and error, as far as the request's logLevel lets it, and returns `logged`; confirm(item)
asks the client to confirm item with an elicitation (at 2026-07-28 an input round: the call is
answered `input_required`, and the retry carries the answer), appends `confirm 0 <pid> <time>` to
LEDGER (n 0) once answered, and returns `<item>: yes` or `no`; update(uri) announces that the
resource at uri (the template note://{n}) was updated (to the listens that subscribed to it) and
returns `updated`; grow() adds the tool zone(zone, q) (returning `<q>#<zone>`, its `zone` marked
`x-mcp-header: Zone`) and returns `grown`; slow() reports progress and waits a minute, appending
`cancelled 0 <pid> <time>` to LEDGER if the call is cancelled meanwhile (at 2026-07-28: its
client closed the call's stream); touch() announces that the tool list changed
(on the subscriptions/listen streams that asked for it) and returns `touched`.
"""

import os
import sys
import time
from typing import Annotated

import anyio

from mcp.server import streamable_http_manager as manager
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel, Field

port, ledger = int(sys.argv[1]), sys.argv[2]
server = MCPServer("modern-only")


@server.tool()
def echo(text: str) -> str:
    """Returns text."""
    return text


@server.tool()
def lookup(n: int) -> str:
    """Looks n up, and records it."""
    with open(ledger, "a") as f:
        f.write(f"lookup {n} {os.getpid()} {time.time():.3f}\n")
    return f"lookup {n}"


@server.tool()
def region(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], q: str) -> str:
    """Runs q in region (which the request mirrors in Mcp-Param-Region)."""
    return f"{q}@{region}"


@server.tool()
async def log(ctx: Context) -> str:
    """Sends a log message at debug, info, warning and error (the server sends those at or above
    the level the request opted in to with its logLevel, none without), then returns."""
    for level in ("debug", "info", "warning", "error"):
        article = "an" if level == "error" else "a"
        await ctx.log(level, f"{article} {level} message")
    return "logged"


def zone(zone: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Zone"})], q: str) -> str:
    """Runs q in zone (which the request mirrors in Mcp-Param-Zone)."""
    return f"{q}#{zone}"


@server.tool()
def grow() -> str:
    """Adds the tool zone, whose zone argument is mirrored in a header."""
    server.add_tool(zone)
    return "grown"


@server.tool()
async def slow(ctx: Context) -> str:
    """Reports progress, then waits a minute; a call cancelled meanwhile is put on record."""
    try:
        await ctx.report_progress(1, 10)
        await anyio.sleep(60)
    except anyio.get_cancelled_exc_class():
        with open(ledger, "a") as f:
            f.write(f"cancelled 0 {os.getpid()} {time.time():.3f}\n")
        raise
    return "slept"


class Confirmed(BaseModel):
    ok: bool


def ask(item: str):
    return Elicit(f"Confirm {item}?", Confirmed)


@server.tool()
def confirm(item: str, answer: Annotated[Confirmed, Resolve(ask)]) -> str:
    """Asks the client to confirm item (an input round: the 2026-07-28 form of elicitation)."""
    with open(ledger, "a") as f:
        f.write(f"confirm 0 {os.getpid()} {time.time():.3f}\n")
    return f"{item}: {'yes' if answer.ok else 'no'}"


@server.tool()
async def update(ctx: Context, uri: str) -> str:
    """Announces that the resource at uri was updated."""
    await ctx.notify_resource_updated(uri)
    return "updated"


@server.resource("note://{n}")
def note(n: str) -> str:
    """A note, to subscribe to."""
    return f"note {n}"


@server.tool()
async def touch(ctx: Context) -> str:
    """Announces that the tool list changed."""
    await ctx.notify_tools_changed()
    return "touched"


async def modern_only(self, scope, receive, send):
    if self._task_group is None:
        raise RuntimeError("the session manager has not started")
    await handle_modern_request(
        self.app, self.security_settings, self.json_response, self._lifespan_state, scope, receive, send
    )


manager.StreamableHTTPSessionManager._handle_request = modern_only
server.run("streamable-http", host="127.0.0.1", port=port)
