"""The official MCP Python SDK's client pinned to the final 2026-07-28 revision, as a test peer
for holdfast's era bridge (tests/it/era_bridge.rs).

Usage: python modern_client.py URL [--mode=MODE] [--input] [--log-level=LEVEL] OP...
  OP: list | call:NAME:JSONARGS | progress:NAME:JSONARGS | cancel:NAME:JSONARGS | prompts
      | prompt:NAME:JSONARGS | read:URI | listen:TOOL:URI | wait

A pinned client sends no `server/discover` and no handshake: every request carries the revision
in its headers and `_meta`. Prints `era <version>` once connected (or `connect-failed <error>`),
then one line per op: `ok <op> <summary>` or `err <op> <error>`; `wait` prints `waiting` and
reads one line from stdin before it goes on (the test restarts the server meanwhile). With
`--log-level`, every request opts in to log messages from that level, and each one received
prints `log <level> <data>`; `progress:` calls a tool with a progress callback and prints how
many progress notifications arrived before its result; `cancel:` calls a tool and cancels the
call at its first progress notification (at 2026-07-28 the client closes the call's stream),
printing `ok <op> cancelled`. `listen:` opens a `subscriptions/listen` for updates of URI, calls
TOOL (with no arguments) once acknowledged, and prints what was honoured and the first update
that arrived (waiting at most 30 s). `--mode` is the SDK's connect mode (default the pinned
`2026-07-28`; `auto` asks `server/discover` first and falls back to the handshake). With
`--input`, the client takes a server's requests for input (elicitation: accepts with the name
`Ada`; sampling: answers `sampled`), printing `asked <method>` for each; at 2026-07-28 they come
as input rounds, answered by calling again.
"""

import asyncio
import json
import sys

import anyio

import mcp_types as types
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated


async def run(client: Client, op: str) -> str:
    kind, _, rest = op.partition(":")
    if kind == "progress":
        name, _, args = rest.partition(":")
        seen = []

        async def progress(done, total, message):
            seen.append(done)

        result = await client.call_tool(name, json.loads(args or "{}"), progress_callback=progress)
        if result.is_error:
            raise RuntimeError(f"tool error after {len(seen)} progress")
        return f"{len(seen)} progress, done"
    if kind == "cancel":
        name, _, args = rest.partition(":")
        with anyio.CancelScope() as scope:

            async def first_progress(done, total, message):
                scope.cancel()

            await client.call_tool(name, json.loads(args or "{}"), progress_callback=first_progress)
            return "answered"
        return "cancelled"
    if kind == "listen":
        tool, _, uri = rest.partition(":")
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            honoured = ",".join(subscription.honored.resource_subscriptions or [])
            await client.call_tool(tool, {})
            with anyio.fail_after(30):
                async for event in subscription:
                    if isinstance(event, ResourceUpdated):
                        return f"honoured {honoured} updated {event.uri}"
        return f"honoured {honoured} ended"
    if kind == "prompts":
        listed = await client.list_prompts()
        return ",".join(sorted(prompt.name for prompt in listed.prompts))
    if kind == "prompt":
        name, _, args = rest.partition(":")
        got = await client.get_prompt(name, json.loads(args or "{}"))
        return f"{len(got.messages)} messages"
    if kind == "read":
        read = await client.read_resource(rest)
        return f"{len(read.contents)} contents {read.contents[0].uri}"
    if kind == "list":
        listed = await client.list_tools()
        return ",".join(sorted(tool.name for tool in listed.tools))
    if kind == "call":
        name, _, args = rest.partition(":")
        result = await client.call_tool(name, json.loads(args or "{}"))
        text = " ".join(c.text for c in result.content if getattr(c, "text", None)).replace("\n", " ")
        if result.is_error:
            raise RuntimeError(f"tool error: {text}")
        return text
    raise ValueError(f"unknown op {op!r}")


async def main() -> None:
    url, ops = sys.argv[1], sys.argv[2:]
    options = {}
    mode = "2026-07-28"
    if ops and ops[0].startswith("--mode="):
        mode = ops.pop(0).split("=", 1)[1]
    if ops and ops[0] == "--input":
        ops.pop(0)

        async def elicit(context, params):
            print("asked elicitation/create", flush=True)
            return types.ElicitResult(action="accept", content={"name": "Ada", "check": True})

        async def sample(context, params):
            print("asked sampling/createMessage", flush=True)
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text="sampled"), model="test"
            )

        options["elicitation_callback"] = elicit
        options["sampling_callback"] = sample
    if ops and ops[0].startswith("--log-level="):
        options["log_level"] = ops.pop(0).split("=", 1)[1]

        async def logged(params) -> None:
            print("log", params.level, params.data, flush=True)

        options["logging_callback"] = logged
    try:
        async with Client(url, mode=mode, **options) as client:
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
