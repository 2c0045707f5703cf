"""An MCP client from PyPI, driven one command at a time by a Rust test (tests/it/support/clients.rs),
speaking the same lines as tests/node/client.mjs so one Rust type drives both.

Usage: python session_client.py [--fastmcp | --fastmcp-handshake | --handshake] URL
  default:   the official Python SDK's `mcp.Client` in its default mode ("auto": `server/discover`
             first, the 2025 handshake when the server does not know it);
  --handshake: the same client pinned to the 2025 handshake (`mode="legacy"`), as against a
             server of both eras it would otherwise pick 2026-07-28 and have no session;
  --fastmcp: `fastmcp.Client` (PyPI fastmcp), one client object for the whole run, as an
             application keeps it; --fastmcp-handshake: the same pinned to the 2025 handshake.
stdout: one JSON line per event: {"event":"ready","sessionId":null,"era":<version>} once
        connected (or {"event":"failed","error":...} and exit 1), then per command
        {"event":"result","ok":true,"text":<first text content>,"sessionId":null} or
        {"event":"result","ok":false,"error":<the client's message>,"sessionId":null}. Neither
        client shows its session id, so it is always null.
stdin:  one JSON command per line: {"op":"call","tool":"echo","args":{...}}, {"op":"list"} (the
        tools' names, comma-separated), {"op":"toolsChanged"} (waits until a
        notifications/tools/list_changed arrived; the text is how many did), {"op":"close"}
        (leave the client's context, which ends the session, then exit). EOF: the same.
stderr: the client's own logging, for the test's failure messages.
"""

import asyncio
import json
import sys


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


def first_text(result) -> str:
    for content in getattr(result, "content", None) or []:
        if getattr(content, "type", None) == "text":
            return content.text
    return ""


# Tool-list changes the server announced, and who waits for the next one.
tools_changed = {"count": 0, "event": None}


async def on_message(message) -> None:
    """Every message the server sends the client: counts notifications/tools/list_changed."""
    root = getattr(message, "root", message)
    if getattr(root, "method", None) == "notifications/tools/list_changed":
        tools_changed["count"] += 1
        print("notification: tools/list_changed", file=sys.stderr, flush=True)
        tools_changed["event"].set()


def make_client(url: str, flavour: str):
    tools_changed["event"] = asyncio.Event()
    if flavour in ("fastmcp", "fastmcp-handshake"):
        from fastmcp import Client

        mode = "legacy" if flavour == "fastmcp-handshake" else "auto"
        return Client(url, message_handler=on_message, mode=mode)
    from mcp import Client

    if flavour == "handshake":
        return Client(url, mode="legacy", message_handler=on_message)
    return Client(url, message_handler=on_message)


async def read_line() -> str:
    # stdin is read on a thread: the client's own tasks keep running meanwhile.
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def perform(client, command: dict) -> str:
    if command.get("op") == "list":
        listed = await client.list_tools()
        # The SDK's client answers the result, fastmcp's the list.
        return ",".join(tool.name for tool in getattr(listed, "tools", listed))
    if command.get("op") == "toolsChanged":
        if tools_changed["count"] == 0:
            await tools_changed["event"].wait()
        return str(tools_changed["count"])
    if command.get("op") != "call":
        raise ValueError(f"unknown op {command.get('op')!r}")
    result = await client.call_tool(command["tool"], command.get("args") or {})
    text = first_text(result)
    if getattr(result, "is_error", False) or getattr(result, "isError", False):
        raise RuntimeError(f"tool error: {text}")
    return text


async def main() -> None:
    args = sys.argv[1:]
    flavours = {"--fastmcp": "fastmcp", "--fastmcp-handshake": "fastmcp-handshake", "--handshake": "handshake"}
    flavour = flavours.get(args[0] if args else "", "sdk")
    url = args[-1]
    try:
        client = make_client(url, flavour)
        await client.__aenter__()
    except Exception as error:  # the test reads why
        emit({"event": "failed", "error": repr(error)})
        sys.exit(1)
    era = getattr(client, "protocol_version", None)
    emit({"event": "ready", "sessionId": None, "era": str(era) if era else None})
    while True:
        line = await read_line()
        if not line:
            break
        if not line.strip():
            continue
        command = json.loads(line)
        if command.get("op") == "close":
            try:
                await client.__aexit__(None, None, None)
                emit({"event": "result", "ok": True, "text": "", "sessionId": None})
            except Exception as error:
                emit({"event": "result", "ok": False, "error": repr(error), "sessionId": None})
            return
        try:
            text = await perform(client, command)
            emit({"event": "result", "ok": True, "text": text, "sessionId": None})
        except Exception as error:  # every failure is the test's to see
            emit({"event": "result", "ok": False, "error": repr(error), "sessionId": None})
    await client.__aexit__(None, None, None)


asyncio.run(main())
