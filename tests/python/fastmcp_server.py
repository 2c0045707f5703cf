"""FastMCP (PyPI `fastmcp`, the version .ci/run installs) as people deploy it: `mcp.run` with the
HTTP transport and its defaults (stateful: sessions in memory, SSE answers), under uvicorn. Used
by tests/it/compat.rs.

Usage: python fastmcp_server.py PORT
Tool: `echo` returns its `message`.
"""

import sys

from fastmcp import FastMCP

server = FastMCP("holdfast-fastmcp")


@server.tool
def echo(message: str) -> str:
    """Returns the message."""
    return message


if __name__ == "__main__":
    server.run(
        transport="http",
        host="127.0.0.1",
        port=int(sys.argv[1]),
        show_banner=False,
        log_level="warning",
    )
