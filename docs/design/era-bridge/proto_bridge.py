"""A throwaway PROTOTYPE of holdfast's era bridge, direction 2026-07-28 client -> 2025 server, to
check the translation table against the real Python SDK client (mcp 2.3.0, mode="2026-07-28") and
real 2025 servers (TypeScript SDK 1.32.2, the everything server). Not holdfast's design in every
detail: no holding, no restarts, one principal per Authorization value, sessions in memory.

Usage: python proto_bridge.py LISTEN_PORT UPSTREAM_URL
"""
import asyncio, base64, hashlib, itertools, json, os, sys
import httpx2, uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

PORT, UPSTREAM = int(sys.argv[1]), sys.argv[2]
MODERN = "2026-07-28"
P = "io.modelcontextprotocol/"
ACCEPT = "application/json, text/event-stream"
http = httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=300))
log = lambda *a: print("bridge:", *a, file=sys.stderr, flush=True)


class Upstream:
    """One upstream 2025 session, opened on a principal's behalf."""
    def __init__(self, caps):
        self.caps, self.sid, self.version, self.init = caps, None, None, None
        self.lock = asyncio.Lock()

    async def ensure(self, client_info):
        async with self.lock:
            if self.sid:
                return
            body = {"jsonrpc": "2.0", "id": "holdfast-init", "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": self.caps,
                "clientInfo": client_info or {"name": "holdfast-bridge", "version": "0"}}}
            r = await http.post(UPSTREAM, json=body, headers={"accept": ACCEPT})
            self.init = next(m for m in parse(r) if m.get("id") == "holdfast-init")["result"]
            self.sid, self.version = r.headers["mcp-session-id"], self.init["protocolVersion"]
            await http.post(UPSTREAM, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                            headers=self.headers())
            log("opened upstream session", self.sid, self.version, "caps", json.dumps(self.caps))

    def headers(self):
        return {"accept": ACCEPT, "content-type": "application/json",
                "mcp-session-id": self.sid, "mcp-protocol-version": self.version}


sessions = {}   # (sha256(Authorization), sha256(canonical clientCapabilities)) -> Upstream
pending = {}    # MRTR handle -> (upstream, open upstream response, iterator, s2c request ids by key)
discover_cache = None


def parse(r):
    """The JSON-RPC messages of a whole (already read) answer, JSON or SSE."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return [json.loads(l[5:]) for l in r.text.splitlines() if l.startswith("data:") and l[5:].strip()]
    return [r.json()]


def session_for(req, meta):
    caps = meta.get(P + "clientCapabilities", {})
    # roots: a 2025 server may ask for roots at any time (not only inside a request); a 2026 client
    # answers only inside MRTR rounds, so roots.listChanged is never promised upstream.
    caps = {k: v for k, v in caps.items() if k != "roots"} | ({"roots": {}} if "roots" in caps else {})
    key = (hashlib.sha256(req.headers.get("authorization", "").encode()).hexdigest(),
           hashlib.sha256(json.dumps(caps, sort_keys=True).encode()).hexdigest())
    return sessions.setdefault(key, Upstream(caps))


def to_2025(body):
    """The request with the 2026 envelope keys taken out of params._meta (progressToken stays)."""
    params = dict(body.get("params") or {})
    meta = {k: v for k, v in (params.get("_meta") or {}).items() if not k.startswith(P)}
    params.pop("inputResponses", None); params.pop("requestState", None)
    if meta: params["_meta"] = meta
    else: params.pop("_meta", None)
    return dict(body, params=params)


def sse(msg):
    return f"event: message\ndata: {json.dumps(msg)}\n\n".encode()


async def upstream_events(resp):
    """JSON-RPC messages from an upstream answer as they come (JSON or SSE)."""
    if resp.headers.get("content-type", "").startswith("application/json"):
        yield json.loads(await resp.aread()); return
    async for line in resp.aiter_lines():
        if line.startswith("data:") and line[5:].strip():
            yield json.loads(line[5:])


async def relay(up, resp, it, client_id, upstream_id, level, method):
    """Streams one upstream exchange to the 2026 client: notifications pass (log messages only when
    the request opted in), a server-to-client request becomes an InputRequiredResult (MRTR), the
    final response gets the client's id and resultType."""
    async for msg in it:
        if "method" in msg and "id" in msg:               # server-to-client request: MRTR
            handle = base64.urlsafe_b64encode(os.urandom(12)).decode()
            key = f"q{msg['id']}"
            pending[handle] = (up, resp, it, {key: msg["id"]}, upstream_id)
            log("s2c", msg["method"], "-> InputRequiredResult", handle)
            yield sse({"jsonrpc": "2.0", "id": client_id, "result": {
                "resultType": "input_required",
                "inputRequests": {key: {"method": msg["method"], "params": msg.get("params", {})}},
                "requestState": handle}})
            return                                       # the upstream exchange stays open
        if "method" in msg:                               # notification
            if msg["method"] == "notifications/message" and level is None:
                continue
            yield sse(msg); continue
        if msg.get("id") == upstream_id:
            if "result" in msg:
                msg["result"].setdefault("resultType", "complete")
                if method in CACHEABLE:   # required by the 2026 schema; a 2025 server never sends them
                    msg["result"].setdefault("ttlMs", 0)
                    msg["result"].setdefault("cacheScope", "private")
            yield sse(dict(msg, id=client_id))
            await resp.aclose(); return


async def mcp(req: Request):
    global discover_cache
    if req.method != "POST":
        return Response(status_code=405, headers={"allow": "POST"})
    body = await req.json()
    meta = (body.get("params") or {}).get("_meta") or {}
    if req.headers.get("mcp-protocol-version") != MODERN or meta.get(P + "protocolVersion") != MODERN:
        return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "error": {"code": -32022,
            "message": "Unsupported protocol version", "data": {"supported": [MODERN],
            "requested": req.headers.get("mcp-protocol-version")}}}, status_code=400)
    if "id" not in body:
        return Response(status_code=202)
    up = session_for(req, meta)
    await up.ensure(meta.get(P + "clientInfo"))
    method, cid = body["method"], body["id"]
    log("client", method, "id", cid)
    if method == "server/discover":
        init = up.init
        return JSONResponse({"jsonrpc": "2.0", "id": cid, "result": {
            "supportedVersions": [MODERN], "capabilities": init["capabilities"],
            **({"instructions": init["instructions"]} if init.get("instructions") else {}),
            "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
            "_meta": {P + "serverInfo": init["serverInfo"]}}})
    if method == "subscriptions/listen":
        return await listen(up, cid, body["params"].get("notifications", {}))
    state = body["params"].get("requestState")
    if state is not None:                                 # an MRTR retry
        up0, resp, it, keys, upstream_id = pending.pop(state)
        for key, sid in keys.items():
            answer = body["params"].get("inputResponses", {}).get(key)
            r = await http.post(UPSTREAM, headers=up.headers(),
                                json={"jsonrpc": "2.0", "id": sid, "result": answer})
            log("answered s2c", sid, "->", r.status_code)
        return StreamingResponse(relay(up, resp, it, cid, upstream_id, meta.get(P + "logLevel"), method),
                                 media_type="text/event-stream")
    upstream_id = f"hf-{next(ids)}"
    out = dict(to_2025(body), id=upstream_id)
    r = http.build_request("POST", UPSTREAM, headers=up.headers(), json=out)
    resp = await http.send(r, stream=True)
    if resp.status_code >= 400:
        text = (await resp.aread()).decode()
        log("upstream", resp.status_code, text[:200])
        return Response(text, status_code=resp.status_code, media_type=resp.headers.get("content-type"))
    return StreamingResponse(relay(up, resp, upstream_events(resp), cid, upstream_id,
                                   meta.get(P + "logLevel"), body["method"]), media_type="text/event-stream")


async def listen(up, cid, wanted):
    """subscriptions/listen on the session's GET stream: subscribe each URI, acknowledge, relay only
    the opted-in notification kinds, tagged with the subscription id."""
    kinds = {"notifications/tools/list_changed": "toolsListChanged",
             "notifications/prompts/list_changed": "promptsListChanged",
             "notifications/resources/list_changed": "resourcesListChanged"}
    uris = wanted.get("resourceSubscriptions") or []
    for uri in uris:
        r = await http.post(UPSTREAM, headers=up.headers(), json={"jsonrpc": "2.0",
            "id": f"hf-{next(ids)}", "method": "resources/subscribe", "params": {"uri": uri}})
        log("resources/subscribe", uri, "->", r.status_code)
    tag = {P + "subscriptionId": cid}
    async def stream():
        yield sse({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                   "params": {"_meta": tag, "notifications": wanted}})
        async with http.stream("GET", UPSTREAM, headers=dict(up.headers(), accept="text/event-stream")) as g:
            log("GET stream ->", g.status_code)
            async for msg in upstream_events(g):
                m = msg.get("method", "")
                if (m in kinds and wanted.get(kinds[m])) or \
                   (m == "notifications/resources/updated" and msg["params"].get("uri") in uris):
                    params = dict(msg.get("params") or {})
                    params["_meta"] = dict(params.get("_meta") or {}, **tag)
                    yield sse(dict(msg, params=params))
    return StreamingResponse(stream(), media_type="text/event-stream")


ids = itertools.count(1)
CACHEABLE = {"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"}
app = Starlette(routes=[Route("/mcp", mcp, methods=["GET", "POST", "DELETE"])])
uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
