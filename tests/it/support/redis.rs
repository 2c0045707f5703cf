//! A Redis server (Debian's `redis-server`) in the foreground, nothing persisted; killed when
//! dropped. The shared session store's peer.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::process::{require_program, Guard};

/// How long redis-server gets to answer a PING.
const START: Duration = Duration::from_secs(20);

/// A running redis-server.
pub struct Redis {
    _child: Guard,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Redis {
    /// Starts redis-server on a free port of 127.0.0.1 and waits until it answers PING.
    pub async fn start() -> Redis {
        Redis::start_at(None).await
    }

    /// Starts redis-server again on `port` (a store that went away and came back), and waits
    /// until it answers PING.
    pub async fn start_on(port: u16) -> Redis {
        Redis::start_at(Some(port)).await
    }

    /// Starts redis-server speaking TLS only, on a free port, with the certificate and key in
    /// `cert` and `key` (PEM files); clients are not asked for a certificate. Ready once its
    /// port accepts (a PING would need TLS).
    pub async fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Redis {
        let program = require_program(
            "redis-server",
            "apt-get update && apt-get install -y redis-server",
        );
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port");
        let mut child = Guard(
            Command::new(&program)
                .args(["--bind", "127.0.0.1", "--port", "0"])
                .args(["--tls-port", &addr.port().to_string()])
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key)
                .args(["--tls-auth-clients", "no"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("run redis-server"),
        );
        let deadline = Instant::now() + START;
        while Instant::now() < deadline {
            assert!(
                child.0.try_wait().expect("poll redis-server").is_none(),
                "redis-server with TLS exited at start"
            );
            if TcpStream::connect(addr).await.is_ok() {
                return Redis {
                    _child: child,
                    addr,
                };
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("redis-server with TLS did not start")
    }

    async fn start_at(port: Option<u16>) -> Redis {
        let program = require_program(
            "redis-server",
            "apt-get update && apt-get install -y redis-server",
        );
        // The port is free when chosen, not reserved: if it was taken meanwhile, try another.
        for _ in 0..3 {
            let addr = match port {
                Some(port) => SocketAddr::from(([127, 0, 0, 1], port)),
                None => std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("find a free port"),
            };
            let mut child = Guard(
                Command::new(&program)
                    .args(["--bind", "127.0.0.1", "--port", &addr.port().to_string()])
                    .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("run redis-server"),
            );
            let deadline = Instant::now() + START;
            while Instant::now() < deadline {
                if child.0.try_wait().expect("poll redis-server").is_some() {
                    break;
                }
                if ping(addr).await {
                    return Redis {
                        _child: child,
                        addr,
                    };
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        panic!("redis-server did not start")
    }

    /// `redis://<addr>/0`.
    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }
}

impl Redis {
    /// `SET key value`, as anyone with write access to the store could (a test's attacker).
    pub async fn set(&self, key: &str, value: &str) {
        let mut stream = TcpStream::connect(self.addr)
            .await
            .expect("connect to redis");
        let command = format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
            key.len(),
            value.len()
        );
        stream
            .write_all(command.as_bytes())
            .await
            .expect("write to redis");
        let mut answer = [0u8; 5];
        stream.read_exact(&mut answer).await.expect("redis answers");
        assert_eq!(&answer, b"+OK\r\n");
    }
}

/// Whether a server at `addr` answers PING with PONG.
async fn ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return false;
    };
    let mut answer = [0u8; 7];
    stream.write_all(b"PING\r\n").await.is_ok()
        && stream.read_exact(&mut answer).await.is_ok()
        && &answer == b"+PONG\r\n"
}
