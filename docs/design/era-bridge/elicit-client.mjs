// The TypeScript SDK client 1.32.2 (2025 handshake) declaring elicitation, answering every
// elicitation/create with {action:"accept", content:{ok:true}}, subscribing to note://1 and printing
// every notification. Usage: node elicit-client.mjs URL
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema, ToolListChangedNotificationSchema, ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
const out = x => console.log(JSON.stringify(x));
const client = new Client({ name: 'elicit-client', version: '1.0.0' }, { capabilities: { elicitation: { form: {} } } });
client.setRequestHandler(ElicitRequestSchema, req => { out({ asked: req.params.message }); return { action: 'accept', content: { ok: true } }; });
client.setNotificationHandler(ToolListChangedNotificationSchema, n => out({ notification: n.method }));
client.setNotificationHandler(ResourceUpdatedNotificationSchema, n => out({ notification: n.method, uri: n.params.uri }));
const transport = new StreamableHTTPClientTransport(new URL(process.argv[2]));
try { await client.connect(transport); } catch (e) { out({ failed: e.message }); process.exit(1); }
out({ ready: transport.sessionId });
for (const [name, args] of [['confirm', { item: 'car' }]]) {
  try { const r = await client.callTool({ name, arguments: args }); out({ call: name, text: r.content[0].text }); }
  catch (e) { out({ call: name, error: e.message }); }
}
try { await client.subscribeResource({ uri: 'note://1' }); out({ subscribed: 'note://1' }); } catch (e) { out({ subscribe: e.message }); }
await new Promise(r => setTimeout(r, 500));
const r = await client.callTool({ name: 'touch', arguments: {} }); out({ call: 'touch', text: r.content[0].text });
await new Promise(r => setTimeout(r, 1500));
await transport.terminateSession(); await client.close(); process.exit(0);
