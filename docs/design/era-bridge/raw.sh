#!/usr/bin/env bash
# raw.sh PORT METHOD PARAMS_JSON [extra curl args...]: one 2026-07-28 request, printed with its answer.
port=$1 method=$2 params=$3; shift 3
meta='{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"0"},"io.modelcontextprotocol/clientCapabilities":{}}'
body=$(jq -cn --arg m "$method" --argjson p "$params" --argjson meta "$meta" '{jsonrpc:"2.0",id:7,method:$m,params:($p + {_meta:$meta})}')
curl -s -i -m 5 -X POST "http://127.0.0.1:$port/mcp" -H 'content-type: application/json' \
  -H 'accept: application/json, text/event-stream' -H 'mcp-protocol-version: 2026-07-28' \
  -H "mcp-method: $method" "$@" -d "$body" | grep -v -i '^date:\|^server:'
echo
