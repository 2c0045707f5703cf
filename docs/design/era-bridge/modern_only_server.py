"""A 2026-07-28-ONLY MCP server: the official Python SDK's MCPServer (mcp 2.3.0) with its handshake
path cut off. mcp 2.3.0 has no setting for this: its StreamableHTTPSessionManager routes a request to
the modern (stateless) entry only when MCP-Protocol-Version names a non-handshake version, and
everything else (initialize, which carries no such header) to the 2025 session path
(mcp/server/streamable_http_manager.py:187-203). Here every request goes to the modern entry
(mcp/server/_streamable_http_modern.py handle_modern_request), which answers GET/DELETE 405 and
ignores Mcp-Session-Id, as the 2026-07-28 transport page says a modern-only server should.

Usage: python modern_only_server.py PORT LEDGER
Tools: echo(text), lookup(n) [readOnly, idempotent; appends to LEDGER], region(region, q) [region
carries x-mcp-header "Region"], confirm(item) [asks the client via elicitation: MRTR in 2026],
resource note://{n}, prompt greet(name).
"""
import os, sys, time
from typing import Annotated

from mcp.server import streamable_http_manager as shm
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

port, ledger = int(sys.argv[1]), sys.argv[2]
server = MCPServer("modern-only")


@server.tool()
def echo(text: str) -> str:
    """Returns text."""
    return text


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def lookup(n: int) -> str:
    """Looks n up (and records it)."""
    with open(ledger, "a") as f:
        f.write(f"lookup {n} {os.getpid()} {time.time():.3f}\n")
    return f"lookup {n}"


@server.tool()
def region(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})], q: str) -> str:
    """Runs q in region (region is mirrored into Mcp-Param-Region)."""
    return f"{q}@{region}"


class Ok(BaseModel):
    ok: bool


def ask(item: str):
    return Elicit(f"Confirm {item}?", Ok)


@server.tool()
def confirm(item: str, answer: Annotated[Ok, Resolve(ask)]) -> str:
    """Asks the client to confirm item."""
    return f"{item}: {'yes' if answer.ok else 'no'}"


@server.tool()
async def touch(ctx: Context) -> str:
    """Announces that the tool list changed (and the resource note://1 was updated)."""
    await ctx.notify_tools_changed()
    await ctx.notify_resource_updated("note://1")
    return "touched"


@server.resource("note://{n}")
def note(n: str) -> str:
    """Note n."""
    return f"note {n}"


@server.prompt()
def greet(name: str) -> str:
    """Greets name."""
    return f"Hello, {name}"


async def modern_only(self, scope, receive, send):
    if self._task_group is None:
        raise RuntimeError("not started")
    await handle_modern_request(self.app, self.security_settings, self.json_response,
                                self._lifespan_state, scope, receive, send)


shm.StreamableHTTPSessionManager._handle_request = modern_only
server.run("streamable-http", host="127.0.0.1", port=port)
