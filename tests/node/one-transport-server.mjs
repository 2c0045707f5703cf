// A stateful MCP server written the shortest way the official TypeScript SDK allows: ONE
// StreamableHTTPServerTransport (with a session id generator) answering every request, on node's
// plain `http` module. `@hono/mcp` servers work the same way. It knows one session for its whole
// life; after a restart its transport is new and uninitialized, so it answers the old session
// id with the SDK's 400 "Bad Request: Server not initialized", not with a 404
// (docs/compatibility.md#forgotten-sessions). Used by tests/it/compat.rs.
//
// Usage: node one-transport-server.mjs PORT
// stdout: nothing; stderr: the SDK's errors. Tool: `echo` returns its `message`. With
// HOLDFAST_TEST_RELEASE=extra (the next version of a deploy, tests/it/server_changes.rs) one tool
// more: `extra`.
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
    console.error('usage: node one-transport-server.mjs PORT');
    process.exit(2);
}
// A container stopped with SIGTERM dies with its connections cut; so does this server.
process.on('SIGTERM', () => process.exit(0));

const server = new McpServer({ name: 'holdfast-one-transport', version: '1.0.0' });
server.registerTool(
    'echo',
    { description: 'Return the given message', inputSchema: { message: z.string() } },
    ({ message }) => ({ content: [{ type: 'text', text: message }] })
);
if ((process.env.HOLDFAST_TEST_RELEASE ?? '').split(',').includes('extra')) {
    server.registerTool(
        'extra',
        { description: "The next version's new tool", inputSchema: { message: z.string() } },
        ({ message }) => ({ content: [{ type: 'text', text: message }] })
    );
}
const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID() });
await server.connect(transport);

createServer((req, res) => {
    if (new URL(req.url, 'http://x').pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
    }
    transport.handleRequest(req, res).catch(error => {
        console.error(error);
        if (!res.headersSent) {
            res.writeHead(500).end();
        }
    });
}).listen(port, '127.0.0.1');
