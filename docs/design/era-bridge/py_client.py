"""The official Python SDK client (mcp 2.3.0) in a chosen mode, tracing every HTTP exchange.

Usage: python py_client.py URL MODE OP...
  MODE: 2026-07-28 | auto | legacy
  OP:   list | call:NAME:JSONARGS | read:URI | prompts | prompt:NAME:JSONARGS | listen
stdout: `era <version>` then one `ok <op> <summary>` / `err <op> <error>` line per op;
stderr: one line per HTTP exchange (method, MCP headers, JSON-RPC method, status, body if an error).
"""
import asyncio, json, sys
import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

async def on_request(request):
    try:
        body = json.loads(request.content or b"{}")
    except Exception:
        body = {}
    h = request.headers
    print(f"  -> {request.method} rpc={body.get('method', 'response' if 'result' in body else '-')} "
          f"MCP-Protocol-Version={h.get('mcp-protocol-version')} Mcp-Method={h.get('mcp-method')} "
          f"Mcp-Name={h.get('mcp-name')} Mcp-Session-Id={h.get('mcp-session-id')} "
          f"meta={json.dumps((body.get('params') or {}).get('_meta'))}", file=sys.stderr, flush=True)

async def on_response(response):
    ct = response.headers.get("content-type", "")
    extra = ""
    if response.status_code >= 400:
        await response.aread()
        extra = " body=" + response.text[:300]
    print(f"  <- {response.status_code} {ct}{extra}", file=sys.stderr, flush=True)

async def elicit(context, params):
    print(f"  [elicitation asked: {params.message!r}]", file=sys.stderr, flush=True)
    return mcp_types.ElicitResult(action="decline")

async def progress(p, total, message):
    print(f"  [progress {p}/{total} {message}]", file=sys.stderr, flush=True)

async def run_op(client, op):
    kind, _, rest = op.partition(":")
    if kind == "list":
        r = await client.list_tools()
        return ",".join(t.name for t in r.tools)
    if kind == "call":
        name, _, args = rest.partition(":")
        r = await client.call_tool(name, json.loads(args or "{}"), progress_callback=progress)
        return json.dumps([c.model_dump(exclude_none=True) for c in r.content])[:200]
    if kind == "read":
        r = await client.read_resource(rest)
        return json.dumps(r.model_dump(exclude_none=True, by_alias=True))[:200]
    if kind == "prompts":
        r = await client.list_prompts()
        return ",".join(p.name for p in r.prompts)
    if kind == "prompt":
        name, _, args = rest.partition(":")
        r = await client.get_prompt(name, json.loads(args or "{}"))
        return json.dumps(r.model_dump(exclude_none=True, by_alias=True))[:200]
    if kind == "listen":
        async with client.listen(tools_list_changed=True, resource_subscriptions=[rest] if rest else ()) as sub:
            with anyio.move_on_after(8):
                async for ev in sub:
                    return f"event {ev!r}"[:200]
            return "listening, no event within 2s"
    raise ValueError(op)

async def main():
    url, mode, ops = sys.argv[1], sys.argv[2], sys.argv[3:]
    http = httpx2.AsyncClient(event_hooks={"request": [on_request], "response": [on_response]},
                              timeout=httpx2.Timeout(10, read=30))
    try:
        async with Client(streamable_http_client(url, http_client=http), mode=mode,
                          elicitation_callback=elicit, log_level="debug") as client:
            print("era", client.protocol_version, flush=True)
            for op in ops:
                try:
                    print("ok", op, await run_op(client, op), flush=True)
                except Exception as e:
                    print("err", op, repr(e)[:400], flush=True)
    except Exception as e:
        print("connect-failed", repr(e)[:400].replace("\n", " "), flush=True)

asyncio.run(main())
