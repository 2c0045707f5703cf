// A stateful MCP server on the official TypeScript SDK, as most Node MCP servers are written:
// one StreamableHTTPServerTransport per session, kept in an in-memory map (the pattern of the
// SDK's own src/examples/server/simpleStreamableHttp.ts), on node's plain `http` module. A
// restart loses every session, as a recreated container does; the files below survive it.
//
// Usage: node server.mjs --ledger PATH --levels PATH [--port N]   (N = 0: any free port)
// stdout: {"event":"listening","port":N} once accepting connections; nothing else.
// stderr: one line per request, for the test's failure messages.
// Tools: `count` appends a line to the ledger and returns how many lines it now has (so every
// execution is on record, across restarts); `echo` returns its `text`; `log` sends one log
// message at each of debug, info, warning and error on the call's own stream (unfiltered: the
// levels below are recorded, not applied), then returns `logged`. Every
// `logging/setLevel` is appended to the levels file as `setLevel <level>`.
import { appendFileSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest, SetLevelRequestSchema } from '@modelcontextprotocol/sdk/types.js';
// zod is the SDK's own (peer) dependency: McpServer tool schemas are zod shapes.
import { z } from 'zod';

const { values: args } = parseArgs({
    options: {
        port: { type: 'string', default: '0' },
        ledger: { type: 'string' },
        levels: { type: 'string' }
    }
});
if (!args.ledger || !args.levels) {
    console.error('usage: node server.mjs --ledger PATH --levels PATH [--port N]');
    process.exit(2);
}

// A container stopped with SIGTERM dies with its connections cut; so does this server.
process.on('SIGTERM', () => process.exit(0));

function newServer() {
    const server = new McpServer(
        { name: 'holdfast-ts-test-server', version: '1.0.0' },
        { capabilities: { logging: {} } }
    );
    const counting = { description: 'Record one execution; return how many there have been' };
    server.registerTool('count', counting, () => {
        // Synchronous append and read: node runs one at a time, so the number is this call's.
        appendFileSync(args.ledger, 'count\n');
        const lines = readFileSync(args.ledger, 'utf8').split('\n').filter(Boolean).length;
        return { content: [{ type: 'text', text: String(lines) }] };
    });
    server.registerTool(
        'echo',
        { description: 'Return the given text', inputSchema: { text: z.string() } },
        ({ text }) => ({ content: [{ type: 'text', text }] })
    );
    server.registerTool(
        'log',
        { description: 'Send a log message at debug, info, warning and error, then return' },
        async extra => {
            for (const level of ['debug', 'info', 'warning', 'error']) {
                await extra.sendNotification({
                    method: 'notifications/message',
                    params: { level, data: `${level === 'error' ? 'an' : 'a'} ${level} message` }
                });
            }
            return { content: [{ type: 'text', text: 'logged' }] };
        }
    );
    // Replaces the SDK's own handler (which only remembers the level per session) to put each
    // level on record: a test checks a level set before a restart is set again after it.
    server.server.setRequestHandler(SetLevelRequestSchema, request => {
        appendFileSync(args.levels, `setLevel ${request.params.level}\n`);
        return {};
    });
    return server;
}

/** Session id → transport. */
const sessions = new Map();

// A JSON-RPC error as the SDK's transport writes one (createJsonErrorResponse, sent through
// @hono/node-server): same body, same two headers. For an unknown session id that is the SDK's
// own 404 (WebStandardStreamableHTTPServerTransport.validateSession: 404, -32001, 'Session not
// found'), which simpleStreamableHttp.ts also sends when its map has no such session.
function jsonError(res, status, code, message) {
    const body = JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null });
    res.writeHead(status, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(body)
    });
    res.end(body);
}

async function readJson(req) {
    const chunks = [];
    for await (const chunk of req) {
        chunks.push(chunk);
    }
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function handle(req, res) {
    if (new URL(req.url, 'http://x').pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
    }
    let body;
    if (req.method === 'POST') {
        try {
            body = await readJson(req);
            req.rpcMethod = body?.method;
        } catch {
            jsonError(res, 400, -32700, 'Parse error: Invalid JSON');
            return;
        }
    }
    const sessionId = req.headers['mcp-session-id'];
    const known = sessionId ? sessions.get(sessionId) : undefined;
    if (known) {
        await known.handleRequest(req, res, body);
    } else if (sessionId) {
        jsonError(res, 404, -32001, 'Session not found');
    } else if (req.method === 'POST' && isInitializeRequest(body)) {
        const transport = new StreamableHTTPServerTransport({
            sessionIdGenerator: () => randomUUID(),
            // A proxy in front preserves the client's Host, so no DNS-rebinding check (the
            // SDK's default is off too; said here so nobody turns it on by accident).
            enableDnsRebindingProtection: false,
            // Stored when the session exists, before the initialize answer is sent, so the
            // client's next request always finds it.
            onsessioninitialized: id => sessions.set(id, transport)
        });
        transport.onclose = () => sessions.delete(transport.sessionId);
        await newServer().connect(transport);
        await transport.handleRequest(req, res, body);
    } else {
        jsonError(res, 400, -32000, 'Bad Request: No valid session ID provided');
    }
}

const http = createServer((req, res) => {
    res.on('finish', () => {
        const session = req.headers['mcp-session-id'] ?? '-';
        const rpc = req.rpcMethod ?? '-';
        console.error(`server: ${req.method} ${rpc} session=${session} -> ${res.statusCode}`);
    });
    handle(req, res).catch(error => {
        console.error(`server: error: ${error.stack ?? error}`);
        if (!res.headersSent) {
            jsonError(res, 500, -32603, 'Internal server error');
        }
    });
});
http.listen(Number(args.port), '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ event: 'listening', port: http.address().port }) + '\n');
});
