// FastMCP for TypeScript (npm `fastmcp`, pinned in package-lock.json) as people deploy it: the
// `httpStream` transport with its defaults (stateful: sessions in memory, SSE answers). Used by
// tests/it/compat.rs.
//
// Usage: node fastmcp-server.mjs PORT
// Tool: `echo` returns its `message`. With HOLDFAST_TEST_RELEASE=extra (the next version of a
// deploy, tests/it/server_changes.rs) one tool more: `extra`.
import { FastMCP } from 'fastmcp';
import { z } from 'zod';

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
    console.error('usage: node fastmcp-server.mjs PORT');
    process.exit(2);
}
process.on('SIGTERM', () => process.exit(0));

const server = new FastMCP({ name: 'holdfast-fastmcp-ts', version: '1.0.0' });
server.addTool({
    name: 'echo',
    description: 'Return the given message',
    parameters: z.object({ message: z.string() }),
    execute: async ({ message }) => message
});
if ((process.env.HOLDFAST_TEST_RELEASE ?? '').split(',').includes('extra')) {
    server.addTool({
        name: 'extra',
        description: "The next version's new tool: returns the message",
        parameters: z.object({ message: z.string() }),
        execute: async ({ message }) => message
    });
}
await server.start({
    transportType: 'httpStream',
    httpStream: { port, host: '127.0.0.1', endpoint: '/mcp' }
});
