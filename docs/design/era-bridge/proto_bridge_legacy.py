"""A throwaway PROTOTYPE of holdfast's era bridge, direction 2025 client -> 2026-07-28-only server,
to check the translation table against the real TypeScript SDK client 1.32.2 (tests/node/client.mjs)
and a 2026-only server (modern_only_server.py). In memory, no holding, no restarts.

Usage: python proto_bridge_legacy.py LISTEN_PORT UPSTREAM_URL
"""
import asyncio, itertools, json, os, sys, uuid
import httpx2, uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from mcp.shared.inbound import encode_header_value, mcp_param_headers, x_mcp_header_map

PORT, UPSTREAM = int(sys.argv[1]), sys.argv[2]
MODERN, P = "2026-07-28", "io.modelcontextprotocol/"
http = httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=300))
log = lambda *a: print("bridge:", *a, file=sys.stderr, flush=True)
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
sessions = {}      # minted session id -> dict(caps, info, version, level, subs, answers)
schemas = {}       # tool name -> inputSchema (from tools/list answers seen; per principal in holdfast)
ids = itertools.count(1)


def envelope(s, body):
    params = dict(body.get("params") or {})
    meta = dict(params.get("_meta") or {})
    meta[P + "protocolVersion"] = MODERN
    meta[P + "clientCapabilities"] = s["caps"]
    meta[P + "clientInfo"] = s["info"]
    if s["level"]:
        meta[P + "logLevel"] = s["level"]
    params["_meta"] = meta
    return dict(body, params=params)


def headers(body):
    h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
         "mcp-protocol-version": MODERN, "mcp-method": body["method"]}
    key = NAMED.get(body["method"])
    if key and key in body["params"]:
        h["mcp-name"] = encode_header_value(str(body["params"][key]))
    if body["method"] == "tools/call" and body["params"].get("name") in schemas:
        h |= mcp_param_headers(x_mcp_header_map(schemas[body["params"]["name"]]),
                               body["params"].get("arguments") or {})
    return h


async def call(body):
    """One 2026 request upstream; the JSON-RPC messages of its answer, in order."""
    r = await http.post(UPSTREAM, json=body, headers=headers(body))
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return r.status_code, [json.loads(l[5:]) for l in r.text.splitlines() if l.startswith("data:") and l[5:].strip()]
    return r.status_code, [r.json()]


def to_2025(result):
    for k in ("resultType", "ttlMs", "cacheScope"):
        result.pop(k, None)
    return result


async def mcp(req: Request):
    sid = req.headers.get("mcp-session-id")
    if req.method == "DELETE":
        sessions.pop(sid, None); return Response(status_code=200)
    if req.method == "GET":
        return await get_stream(sessions[sid])
    body = await req.json()
    if body.get("method") == "initialize":
        p = body["params"]
        s = {"caps": p.get("capabilities", {}), "info": p.get("clientInfo"), "level": None,
             "version": p["protocolVersion"] if p["protocolVersion"] < MODERN else "2025-11-25",
             "subs": set(), "answers": {}, "out": asyncio.Queue()}
        st, msgs = await call(envelope(s, {"jsonrpc": "2.0", "id": f"hf-{next(ids)}", "method": "server/discover", "params": {}}))
        d = msgs[-1]["result"]
        sid = uuid.uuid4().hex; sessions[sid] = s
        log("initialize terminated; discover ->", st, "supported", d["supportedVersions"])
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {
            "protocolVersion": s["version"], "capabilities": d["capabilities"],
            "serverInfo": (d.get("_meta") or {}).get(P + "serverInfo") or {"name": "?", "version": "?"},
            **({"instructions": d["instructions"]} if d.get("instructions") else {})}},
            headers={"mcp-session-id": sid})
    s = sessions.get(sid)
    if s is None:
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "Session not found"}}, status_code=404)
    if "id" not in body or "method" not in body:      # notification, or an answer to our s2c request
        if "result" in body or "error" in body:
            fut = s["answers"].pop(body["id"], None)
            if fut: fut.set_result(body.get("result"))
        return Response(status_code=202)
    m = body["method"]
    log("client", m, "id", body["id"])
    if m == "ping":
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {}})
    if m == "logging/setLevel":
        s["level"] = body["params"]["level"]; return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {}})
    if m in ("resources/subscribe", "resources/unsubscribe"):
        (s["subs"].add if m.endswith("subscribe") and not m.endswith("unsubscribe") else s["subs"].discard)(body["params"]["uri"])
        await s["out"].put("resubscribe")
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {}})
    return StreamingResponse(exchange(s, body), media_type="text/event-stream")


async def exchange(s, body):
    """The request upstream with the envelope; InputRequiredResult rounds answered by asking the 2025
    client with real server-to-client requests on this stream (MRTR -> 2025 s2c)."""
    original, state, responses = body, None, None
    for _round in range(8):
        b = envelope(s, dict(original, id=f"hf-{next(ids)}"))
        if state is not None: b["params"]["requestState"] = state
        if responses is not None: b["params"]["inputResponses"] = responses
        st, msgs = await call(b)
        for msg in msgs[:-1]:
            yield f"event: message\ndata: {json.dumps(msg)}\n\n".encode()
        final = msgs[-1]
        if st >= 400 or "error" in final:
            log("upstream", st, json.dumps(final)[:200])
            yield f"event: message\ndata: {json.dumps(dict(final, id=original['id']))}\n\n".encode(); return
        res = final["result"]
        if res.get("resultType") != "input_required":
            if original["method"] == "tools/list":
                for t in res.get("tools", []): schemas[t["name"]] = t.get("inputSchema")
            yield f"event: message\ndata: {json.dumps({'jsonrpc': '2.0', 'id': original['id'], 'result': to_2025(res)})}\n\n".encode()
            return
        state, responses = res.get("requestState"), {}
        for key, ir in (res.get("inputRequests") or {}).items():
            rid = f"hf-s2c-{next(ids)}"
            fut = asyncio.get_running_loop().create_future(); s["answers"][rid] = fut
            log("InputRequiredResult ->", ir["method"], "asked as", rid)
            yield f"event: message\ndata: {json.dumps({'jsonrpc': '2.0', 'id': rid, 'method': ir['method'], 'params': ir.get('params', {})})}\n\n".encode()
            responses[key] = await asyncio.wait_for(fut, 60)


async def get_stream(s):
    """The 2025 GET stream as a subscriptions/listen upstream, re-opened when the set of subscribed
    resources changes."""
    async def stream():
        while True:
            body = envelope(s, {"jsonrpc": "2.0", "id": f"hf-listen-{next(ids)}", "method": "subscriptions/listen",
                                "params": {"notifications": {"toolsListChanged": True, "promptsListChanged": True,
                                           "resourcesListChanged": True, "resourceSubscriptions": sorted(s["subs"])}}})
            async with http.stream("POST", UPSTREAM, json=body, headers=headers(body)) as r:
                log("GET stream -> subscriptions/listen", r.status_code, sorted(s["subs"]))
                lines = r.aiter_lines()
                reader = asyncio.ensure_future(anext(lines))
                waiter = asyncio.ensure_future(s["out"].get())
                while True:
                    done, _ = await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    if waiter in done:
                        reader.cancel(); break
                    line = reader.result()
                    reader = asyncio.ensure_future(anext(lines))
                    if line.startswith("data:") and line[5:].strip():
                        msg = json.loads(line[5:])
                        if msg.get("method") == "notifications/subscriptions/acknowledged": continue
                        (msg.get("params") or {}).get("_meta", {}).pop(P + "subscriptionId", None)
                        yield f"event: message\ndata: {json.dumps(msg)}\n\n".encode()
    return StreamingResponse(stream(), media_type="text/event-stream")


app = Starlette(routes=[Route("/mcp", mcp, methods=["GET", "POST", "DELETE"])])
uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
