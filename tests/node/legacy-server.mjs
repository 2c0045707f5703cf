// A legacy MCP server (the deprecated 2024-11-05 HTTP+SSE transport) on the official TypeScript
// SDK, as the SDK's own example (src/examples/server/simpleSseServer.ts) writes one: `GET /sse`
// opens a session's event stream (its first event, `endpoint`, names `/messages?sessionId=...`),
// and the client POSTs its messages there; answers travel back on the stream. Sessions live in
// memory and in their stream: a restart loses them, and a POST for one it does not know gets the
// example's own `404 Session not found`.
//
// Usage: node legacy-server.mjs --ledger PATH [--port N]   (N = 0: any free port)
// stdout: {"event":"listening","port":N} once accepting connections; nothing else.
// stderr: one line per request, for the test's failure messages.
// Tools: `count` appends a line to the ledger and returns how many lines it now has (every
// execution is on record, across restarts).
import { appendFileSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { SSEServerTransport } from '@modelcontextprotocol/sdk/server/sse.js';

const { values: args } = parseArgs({
    options: {
        port: { type: 'string', default: '0' },
        ledger: { type: 'string' }
    }
});
if (!args.ledger) {
    console.error('usage: node legacy-server.mjs --ledger PATH [--port N]');
    process.exit(2);
}

// A container stopped with SIGTERM dies with its connections cut; so does this server.
process.on('SIGTERM', () => process.exit(0));

function newServer() {
    const server = new McpServer({ name: 'holdfast-ts-legacy-server', version: '1.0.0' });
    const counting = { description: 'Record one execution; return how many there have been' };
    server.registerTool('count', counting, () => {
        appendFileSync(args.ledger, 'count\n');
        const lines = readFileSync(args.ledger, 'utf8').split('\n').filter(Boolean).length;
        return { content: [{ type: 'text', text: String(lines) }] };
    });
    return server;
}

/** Session id → transport. */
const sessions = new Map();

async function handle(req, res) {
    const url = new URL(req.url, 'http://x');
    if (req.method === 'GET' && url.pathname === '/sse') {
        const transport = new SSEServerTransport('/messages', res);
        sessions.set(transport.sessionId, transport);
        transport.onclose = () => sessions.delete(transport.sessionId);
        await newServer().connect(transport);
        return;
    }
    if (req.method === 'POST' && url.pathname === '/messages') {
        const transport = sessions.get(url.searchParams.get('sessionId'));
        if (!transport) {
            res.writeHead(404, { 'content-type': 'text/plain' }).end('Session not found');
            return;
        }
        await transport.handlePostMessage(req, res);
        return;
    }
    res.writeHead(404).end();
}

const http = createServer((req, res) => {
    res.on('finish', () => {
        console.error(`server: ${req.method} ${req.url} -> ${res.statusCode}`);
    });
    handle(req, res).catch(error => {
        console.error(`server: error: ${error.stack ?? error}`);
        if (!res.headersSent) {
            res.writeHead(500).end();
        }
    });
});
http.listen(Number(args.port), '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ event: 'listening', port: http.address().port }) + '\n');
});
