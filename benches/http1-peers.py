#!/usr/bin/env python3
"""What other proxies do with the inputs of issue 25's classes: the README's "What holdfast
accepts on HTTP/1" table, measured, not guessed.

Usage: python3 benches/http1-peers.py [HOLDFAST_BINARY]
Needs nginx and haproxy on PATH (Debian: apt-get install -y nginx haproxy). Runs each proxy on
loopback in front of a raw upstream that records every byte it is sent and answers every head
`200` at once; sends each input on one connection and reports per proxy: the
status lines the client got, and the request lines that reached the upstream. Nothing here is
part of the tests: the regression tests are tests/it/smuggling.rs, strict.rs and oracle/.
"""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: mcp.example\r\n\r\n"


def post(body, extra=b""):
    return (b"POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nContent-Type: application/json\r\n"
            + extra + b"Transfer-Encoding: chunked\r\n\r\n" + body)


INPUTS = [
    ("1 body fails to decode, then a request", post(b"5\r\nhello\r\n" + SMUGGLED)),
    ("2 trailer section ended by a bare LF", post(b"5\r\nhello\r\n0\r\n\n" + SMUGGLED)),
    ("3 trailer fields (Mcp-Session-Id, X-Forwarded-For)",
     post(b"5\r\nhello\r\n0\r\nMcp-Session-Id: evil\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n")),
    ("4 lone CR in a chunk size", post(b"5\rx\r\nhello\r\n0\r\n\r\n")),
    ("4 form feed after a chunk size", post(b"5\x0c\r\nhello\r\n0\r\n\r\n")),
    ("5 CONNECT", b"CONNECT mcp.example:443 HTTP/1.1\r\nHost: mcp.example:443\r\n\r\n"),
    ("5 authority-form target", b"GET mcp.example:443 HTTP/1.1\r\nHost: mcp.example\r\n\r\n"),
    ("5 absolute-form, another Host", b"GET http://other.example/mcp HTTP/1.1\r\nHost: mcp.example\r\n\r\n"),
    ("- Content-Length and Transfer-Encoding",
     post(b"5\r\nhello\r\n0\r\n\r\n", b"Content-Length: 5\r\n")),
    ("- Content-Length list 5, 5",
     b"POST /mcp HTTP/1.1\r\nHost: mcp.example\r\nContent-Length: 5, 5\r\n\r\nhello"),
]


class Upstream:
    """Records every connection's bytes; answers 200 to every head it sees."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.received = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        data = b""
        index = len(self.received)
        self.received.append(b"")
        answered = 0
        conn.settimeout(2)
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
                self.received[index] = data
                while answered < data.count(b"\r\n\r\n"):
                    answered += 1
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        except OSError:
            return
        finally:
            conn.close()

    def request_lines(self):
        lines = []
        for conn in self.received:
            for line in conn.split(b"\r\n"):
                parts = line.split(b" ")
                if len(parts) == 3 and parts[2].startswith(b"HTTP/1."):
                    lines.append(line.decode(errors="replace"))
        return lines

    def has(self, needle):
        return any(needle in conn for conn in self.received)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def start_nginx(up, port, tmp):
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; pid {tmp}/nginx.pid; error_log {tmp}/error.log;
events {{}}
http {{ access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp};
  server {{ listen 127.0.0.1:{port};
    location / {{ proxy_pass http://127.0.0.1:{up}; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_request_buffering off; }} }} }}
""")
    return subprocess.Popen(["nginx", "-c", conf], stderr=subprocess.DEVNULL)


def start_haproxy(up, port, tmp):
    conf = os.path.join(tmp, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(f"""defaults
  mode http
  timeout connect 2s
  timeout client 3s
  timeout server 3s
frontend f
  bind 127.0.0.1:{port}
  default_backend b
backend b
  server s 127.0.0.1:{up}
""")
    return subprocess.Popen(["haproxy", "-f", conf], stderr=subprocess.DEVNULL)


def start_holdfast(binary, up, port, tmp):
    env = dict(os.environ, HOLDFAST_ROUTES__BEHIND_ROUTER="false")
    return subprocess.Popen([binary, "--upstream", f"http://127.0.0.1:{up}", "--listen",
                             f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{free_port()}"],
                            env=env, stderr=subprocess.DEVNULL)


def send(port, data):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(data)
    # No half-close: a proxy may take the client's FIN for a client that gave up (holdfast
    # and nginx both drop such a request). Read until the proxy closes, or is quiet for 1.5 s.
    s.settimeout(1.5)
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    s.close()
    return [line.decode() for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.")]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/holdfast"
    proxies = [("holdfast", lambda u, p, t: start_holdfast(binary, u, p, t)),
               ("nginx", start_nginx), ("haproxy", start_haproxy)]
    for name, start in proxies:
        print(f"## {name}")
        for label, data in INPUTS:
            up = Upstream()
            port = free_port()
            with tempfile.TemporaryDirectory() as tmp:
                proc = start(up.port, port, tmp)
                try:
                    wait_port(port)
                    answers = send(port, data)
                    time.sleep(0.3)
                finally:
                    proc.terminate()
                    proc.wait()
            smuggled = up.has(b"/smuggled")
            trailers = up.has(b"evil") or up.has(b"6.6.6.6")
            print(f"{label}: client got {answers}; upstream got {up.request_lines()}"
                  f"{'; /smuggled forwarded as a request' if smuggled else ''}{'; trailers forwarded' if trailers else ''}")


if __name__ == "__main__":
    main()
