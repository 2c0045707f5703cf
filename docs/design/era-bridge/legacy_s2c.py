"""What a 2025 server's server-to-client request looks like on the wire (the reference everything
server): initialize declaring elicitation+sampling, then tools/call trigger-elicitation-request; the
elicitation/create request arrives on the tools/call POST's SSE stream; the client answers it with a
separate POST carrying the session id; the tool result then ends the first stream.
Usage: python legacy_s2c.py URL
"""
import asyncio, json, sys
import httpx2

URL = sys.argv[1]
H = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

async def main():
    async with httpx2.AsyncClient(timeout=20) as c:
        r = await c.post(URL, headers=H, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "clientInfo": {"name": "raw", "version": "0"},
            "capabilities": {"elicitation": {"form": {}}, "sampling": {}, "roots": {"listChanged": True}}}})
        sid = r.headers["mcp-session-id"]
        print("initialize ->", r.status_code, r.headers.get("content-type"), "session", sid)
        print("  result:", r.text.strip()[:600])
        h = dict(H, **{"mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"})
        r = await c.post(URL, headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        print("initialized ->", r.status_code)
        async with c.stream("POST", URL, headers=h, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "trigger-elicitation-request", "arguments": {}}}) as s:
            print("tools/call ->", s.status_code, s.headers.get("content-type"))
            async for line in s.aiter_lines():
                if not line.startswith("data:"):
                    if line: print("  sse:", line)
                    continue
                if not line[5:].strip():
                    print("  sse: (priming event, empty data)"); continue
                msg = json.loads(line[5:])
                print("  sse data:", json.dumps(msg)[:500])
                if msg.get("method") == "elicitation/create":
                    answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {"action": "decline"}}
                    r = await c.post(URL, headers=h, json=answer)
                    print("  answer POST ->", r.status_code, r.text[:200])
                if "result" in msg and msg.get("id") == 1:
                    break
        r = await c.delete(URL, headers=h)
        print("DELETE ->", r.status_code)

asyncio.run(main())
