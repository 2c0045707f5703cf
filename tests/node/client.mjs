// The official MCP TypeScript SDK client, driven one command at a time by a Rust test
// (tests/it/support/node.rs) so the test decides when each call happens.
//
// Usage: node client.mjs [--legacy | --elicit | --mcp-remote CONFIG_DIR] URL
//   --elicit: the client declares the elicitation capability and accepts every elicitation
//   with `{"ok": true}`.
//   --legacy: the deprecated 2024-11-05 HTTP+SSE transport (SSEClientTransport): URL is the
//   server's GET stream (e.g. /sse); its `endpoint` event names where the client POSTs.
//   --mcp-remote: the SDK client over stdio to `mcp-remote` (npm, pinned in package-lock.json),
//   the bridge desktop clients run to reach a remote server; it speaks Streamable HTTP to URL
//   with its default settings. CONFIG_DIR: its MCP_REMOTE_CONFIG_DIR (a fresh directory, so no
//   OAuth state of another run is found). Then the trace shows mcp-remote's own stderr; the
//   session id is mcp-remote's and is not seen here (null).
// stdout: one JSON line per event: {"event":"ready","sessionId":...} once connected (or
//         {"event":"failed","error":...} and exit 1), then per command one
//         {"event":"result","ok":true,"text":<first text content>,"sessionId":...} or
//         {"event":"result","ok":false,"error":<the SDK's message>,"sessionId":...}, where
//         sessionId is what the SDK's transport holds after the command. Nothing else.
// stdin:  one JSON command per line: {"op":"call","tool":"count"} ("timeout": ms, optional),
//         {"op":"call","tool":"echo","args":{"text":"x"}}, {"op":"list"} (tools/list; the text
//         is the tool names, comma-separated), {"op":"setLevel","level":"debug"},
//         {"op":"close"} (DELETE the session, then exit), {"op":"toolsChanged"} (waits until a
//         notifications/tools/list_changed arrived, on the GET stream or elsewhere; the text is
//         how many did), {"op":"changes"} (how many arrived so far, without waiting), {"op":"logs"} (the log messages received since the last `logs`, as
//         `level:data`, comma-separated), {"op":"subscribe","uri":U} (resources/subscribe),
//         {"op":"updated"} (waits until a notifications/resources/updated arrived; the text is
//         the URIs updated since the last `updated`), {"op":"cancel","tool":T} (calls T and
//         cancels the call at its first progress notification; the text is `cancelled`). EOF
//         closes without a DELETE.
// stderr: a trace of every HTTP request the SDK makes and of the SDK's own errors, for the
//         test's failure messages and for reading what the client does around a restart.
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
    ElicitRequestSchema,
    LoggingMessageNotificationSchema,
    ResourceUpdatedNotificationSchema,
    ToolListChangedNotificationSchema
} from '@modelcontextprotocol/sdk/types.js';
import { fileURLToPath } from 'node:url';

const legacy = process.argv[2] === '--legacy';
const eliciting = process.argv[2] === '--elicit';
const remoteConfig = process.argv[2] === '--mcp-remote' ? process.argv[3] : undefined;
const url = process.argv[legacy || eliciting ? 3 : remoteConfig ? 4 : 2];
if (!url) {
    console.error('usage: node client.mjs [--legacy | --elicit | --mcp-remote CONFIG_DIR] URL');
    process.exit(2);
}

const emit = event => process.stdout.write(JSON.stringify(event) + '\n');
const trace = text => process.stderr.write(`client: ${text}\n`);

// Wraps fetch only to log: the SDK's requests themselves are untouched, so the test sees the
// real client's headers, its background GET stream and its DELETE.
async function tracedFetch(input, init = {}) {
    const headers = new Headers(init.headers);
    const session = headers.get('mcp-session-id') ?? '-';
    const version = headers.get('mcp-protocol-version') ?? '-';
    let what = '';
    if (typeof init.body === 'string') {
        try {
            what = ` ${JSON.parse(init.body).method ?? 'response'}`;
        } catch {
            what = ' (unparsed body)';
        }
    }
    const request = `${init.method ?? 'GET'}${what} session=${session} version=${version}`;
    try {
        const response = await fetch(input, init);
        trace(`${request} -> ${response.status} ${response.headers.get('content-type') ?? ''}`);
        return response;
    } catch (error) {
        trace(`${request} -> ${error.cause?.code ?? error.name}`);
        throw error;
    }
}

// The legacy transport's event stream goes through the same traced fetch (SSEClientTransport
// hands `fetch` to its EventSource).
function remoteTransport() {
    const proxy = fileURLToPath(new URL('node_modules/mcp-remote/dist/proxy.js', import.meta.url));
    const bridge = new StdioClientTransport({
        command: process.execPath,
        args: [proxy, url],
        env: { ...process.env, MCP_REMOTE_CONFIG_DIR: remoteConfig },
        stderr: 'pipe'
    });
    bridge.stderr?.on('data', chunk => {
        for (const line of String(chunk).split('\n').filter(Boolean)) {
            trace(`mcp-remote: ${line}`);
        }
    });
    return bridge;
}
const transport = legacy
    ? new SSEClientTransport(new URL(url), { fetch: tracedFetch })
    : remoteConfig
      ? remoteTransport()
      : new StreamableHTTPClientTransport(new URL(url), { fetch: tracedFetch });
const client = new Client(
    { name: 'holdfast-ts-test-client', version: '1.0.0' },
    eliciting ? { capabilities: { elicitation: {} } } : undefined
);
if (eliciting) {
    // Every question is accepted, with `ok: true` (the schema of the test server's confirm).
    client.setRequestHandler(ElicitRequestSchema, request => {
        trace(`asked: ${request.params.message}`);
        return { action: 'accept', content: { ok: true } };
    });
}
// Errors the SDK reports out of band (the GET stream dropping, its reconnects failing): not a
// command's result, but what the client went through.
client.onerror = error => trace(`onerror: ${error.message}`);
// Tool-list changes the server announced, and who waits for the next one.
let toolsChanged = 0;
let onToolsChanged = () => {};
client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
    toolsChanged += 1;
    trace('notification: tools/list_changed');
    onToolsChanged();
});

// URIs the server said were updated, and who waits for the next one.
const updated = [];
let onUpdated = () => {};
client.setNotificationHandler(ResourceUpdatedNotificationSchema, notification => {
    updated.push(notification.params.uri);
    trace(`notification: resources/updated ${notification.params.uri}`);
    onUpdated();
});

// Log messages the server sent, as `level:data`, until a `logs` command takes them.
const logs = [];
client.setNotificationHandler(LoggingMessageNotificationSchema, notification => {
    logs.push(`${notification.params.level}:${notification.params.data}`);
});

try {
    await client.connect(transport);
} catch (error) {
    emit({ event: 'failed', error: error.message });
    process.exit(1);
}
emit({ event: 'ready', sessionId: transport.sessionId ?? null });

async function perform(command) {
    switch (command.op) {
        case 'call': {
            const call = { name: command.tool, arguments: command.args ?? {} };
            // A per-call timeout (ms) where the command names one, else the SDK's 60 s.
            const options = command.timeout ? { timeout: command.timeout } : undefined;
            const result = await client.callTool(call, undefined, options);
            const text = result.content?.find(content => content.type === 'text')?.text ?? '';
            if (result.isError) {
                throw new Error(`tool error: ${text}`);
            }
            return text;
        }
        case 'cancel': {
            // Cancelled at its first progress notification: the SDK sends
            // notifications/cancelled and gives up on the call.
            const controller = new AbortController();
            const call = { name: command.tool, arguments: command.args ?? {} };
            const options = { signal: controller.signal, onprogress: () => controller.abort() };
            try {
                await client.callTool(call, undefined, options);
                return 'answered';
            } catch (error) {
                if (controller.signal.aborted) {
                    return 'cancelled';
                }
                throw error;
            }
        }
        case 'list': {
            // Lets a proxy in between read the tools' annotations (what is safe to send twice).
            const listed = await client.listTools();
            return listed.tools.map(tool => tool.name).join(',');
        }
        case 'setLevel':
            await client.setLoggingLevel(command.level);
            return '';
        case 'subscribe':
            await client.subscribeResource({ uri: command.uri });
            return '';
        case 'updated':
            if (updated.length === 0) {
                await new Promise(resolve => {
                    onUpdated = resolve;
                });
            }
            return updated.splice(0).join(',');
        case 'logs':
            return logs.splice(0).join(',');
        case 'changes':
            return String(toolsChanged);
        case 'toolsChanged':
            if (toolsChanged === 0) {
                await new Promise(resolve => {
                    onToolsChanged = resolve;
                });
            }
            return String(toolsChanged);
        case 'close':
            // A legacy session ends with its stream, closed below; mcp-remote ends its own
            // when its stdin closes.
            if (!legacy && !remoteConfig) {
                await transport.terminateSession();
            }
            return '';
        default:
            throw new Error(`unknown op ${JSON.stringify(command.op)}`);
    }
}

// `for await` takes the next line only after the previous command finished, so commands run
// strictly one at a time, in order, as a test reading one result per command expects.
for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (!line.trim()) {
        continue;
    }
    let command;
    try {
        command = JSON.parse(line);
        const text = await perform(command);
        emit({ event: 'result', ok: true, text, sessionId: transport.sessionId ?? null });
    } catch (error) {
        const sessionId = transport.sessionId ?? null;
        emit({ event: 'result', ok: false, error: error.message, sessionId });
    }
    if (command?.op === 'close') {
        break;
    }
}

// Without this the aborted GET stream's reconnect timer could keep the process alive.
await client.close();
process.exit(0);
