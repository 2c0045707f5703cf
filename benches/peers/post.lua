-- wrk's request: a tools/call of about 1 KiB, with the headers an MCP client sends.
local text = string.rep("y", 900)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2025-11-25"
wrk.body = '{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"echo","arguments":{"text":"' .. text .. '"}}}'
