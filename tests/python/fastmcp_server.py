"""FastMCP (PyPI `fastmcp`, the version .ci/run installs) as people deploy it: `mcp.run` with the
HTTP transport and its defaults (stateful: sessions in memory, SSE answers), under uvicorn. Used
by tests/it/compat.rs.

Usage: python fastmcp_server.py PORT
Tool: `echo` returns its `message`. With `HOLDFAST_TEST_RELEASE=extra` (the next version of a
deploy, tests/it/server_changes.rs) one tool more: `extra`.
"""

import os
import sys

from fastmcp import FastMCP

server = FastMCP("holdfast-fastmcp")


@server.tool
def echo(message: str) -> str:
    """Returns the message."""
    return message


if "extra" in os.environ.get("HOLDFAST_TEST_RELEASE", "").split(","):

    @server.tool
    def extra(message: str) -> str:
        """The next version's new tool: returns the message."""
        return message


if __name__ == "__main__":
    server.run(
        transport="http",
        host="127.0.0.1",
        port=int(sys.argv[1]),
        show_banner=False,
        log_level="warning",
    )
