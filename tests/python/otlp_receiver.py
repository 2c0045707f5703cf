"""An OTLP/HTTP traces receiver for holdfast's tests (tests/it/tracing.rs), decoding with the
official protobuf definitions (`opentelemetry-proto` from PyPI), not with holdfast's own crates.

Usage: python otlp_receiver.py [--status N]

Prints one JSON object per line on stdout: first {"listening": PORT}, then one per span received,
flattened: ids in hex, attributes and event attributes as plain values, the resource's
attributes under "resource", the scope's name, the span's flags and the export's `api-key`
header. Answers every POST to /v1/traces with an empty
ExportTraceServiceResponse, or with status N (and no body) when --status says so, to show what
holdfast does when its collector refuses.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

STATUS = 200
if len(sys.argv) == 3 and sys.argv[1] == "--status":
    STATUS = int(sys.argv[2])

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    got = getattr(v, kind)
    if kind == "array_value":
        return [value(x) for x in got.values]
    return got


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    out(
                        {
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": KINDS.get(span.kind, str(span.kind)),
                            "attributes": attributes(span.attributes),
                            "events": [
                                {"name": e.name, "attributes": attributes(e.attributes)}
                                for e in span.events
                            ],
                            "status": STATUS_CODES.get(span.status.code, str(span.status.code)),
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "resource": resource,
                            "scope": ss.scope.name,
                            "flags": span.flags,
                            "api_key": self.headers.get("api-key"),
                            "content_type": self.headers.get("content-type"),
                        }
                    )
        if STATUS != 200:
            self.send_response(STATUS)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, fmt, *args):
        sys.stderr.write("otlp_receiver: " + (fmt % args) + "\n")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
out({"listening": server.server_address[1]})
server.serve_forever()
