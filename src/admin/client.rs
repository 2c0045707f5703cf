//! Asking a running holdfast's admin listener: `holdfast healthcheck`, `pause` and `resume`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::config::AdminToken;

/// Why asking failed.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Nothing answered at the address.
    #[error("cannot reach the admin listener at {addr}: {source}")]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The exchange failed.
    #[error("the admin listener at {addr} failed to answer: {source}")]
    Http {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: hyper::Error,
    },
    /// No answer in time.
    #[error("the admin listener at {0} did not answer in time")]
    Timeout(SocketAddr),
}

/// An unspecified address such as `0.0.0.0` means "this host": loopback is asked.
fn target(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port()))
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    }
}

/// Sends `method path` to the admin listener at `addr` (with the token, if given) and reads the
/// answer, all within `timeout`.
pub async fn ask(
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&AdminToken>,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), AskError> {
    let addr = target(addr);
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| AskError::Connect { addr, source })?;
        let http = |source| AskError::Http { addr, source };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, addr.to_string());
        if let Some(token) = token {
            req = req.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.as_str()),
            );
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .expect("a method, a path and plain headers make a request");
        let resp = sender.send_request(req).await.map_err(http)?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(http)?.to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| AskError::Timeout(addr))?
}

/// Asks `/readyz` on the admin listener at `addr`. True when it answers 200 within `timeout`.
pub async fn is_ready(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(
        ask(addr, Method::GET, "/readyz", None, timeout).await,
        Ok((StatusCode::OK, _))
    )
}

/// Exit status of `holdfast pause` when the drain timeout passed with only GET streams in flight
/// (standalone event streams, which carry no call and which clients open again): the pause is in
/// effect and recreating the server loses nothing. 1 means the pause could not be asked for, 2 a
/// configuration error.
pub const EXIT_STREAMS_ONLY: u8 = 3;

/// Exit status of `holdfast pause` when the drain timeout passed with calls still in flight
/// (a long tool call): the pause is in effect, but recreating the server now would cut them.
pub const EXIT_CALLS_IN_FLIGHT: u8 = 4;

/// What a command prints and how it exits.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// One or more lines for the operator.
    pub message: String,
    /// The exit status.
    pub code: u8,
}

/// `holdfast pause`: asks for a pause and waits for its drain.
pub async fn pause(addr: SocketAddr, token: Option<&AdminToken>, drain: Duration) -> Outcome {
    let path = format!("/pause?drain_timeout_secs={}", drain.as_secs_f64());
    // The admin answers when the drain ends: give it that long, and a little.
    let wait = drain + Duration::from_secs(10);
    let state = match ask_json(addr, Method::POST, &path, token, wait).await {
        Ok(state) => state,
        Err(message) => return Outcome { message, code: 1 },
    };
    let started = state["started"].as_bool().unwrap_or(false);
    let head = if started {
        "paused".to_owned()
    } else {
        format!(
            "already paused for {} s",
            state["paused_secs"].as_f64().unwrap_or(0.0)
        )
    };
    let held = state["held"].as_u64().unwrap_or(0);
    if state["drained"].as_bool() == Some(true) {
        return Outcome {
            message: format!("{head}; nothing in flight ({held} requests held)"),
            code: 0,
        };
    }
    let pending: Vec<String> = state["oldest_in_flight"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}{} for {} s",
                p["method"].as_str().unwrap_or("?"),
                if p["stream"].as_bool() == Some(true) {
                    " stream"
                } else {
                    ""
                },
                p["age_secs"].as_f64().unwrap_or(0.0)
            )
        })
        .collect();
    let calls = state["in_flight_calls"].as_u64().unwrap_or(0);
    let (what, code) = if calls == 0 {
        ("only GET streams, which carry no call,", EXIT_STREAMS_ONLY)
    } else {
        ("calls are", EXIT_CALLS_IN_FLIGHT)
    };
    Outcome {
        message: format!(
            "{head}, but {what} still in flight after the {} s drain timeout ({} requests, \
             {calls} of them calls; oldest first: {}); they are not cut off",
            drain.as_secs_f64(),
            state["in_flight"].as_u64().unwrap_or(0),
            pending.join(", ")
        ),
        code,
    }
}

/// `holdfast resume`.
pub async fn resume(addr: SocketAddr, token: Option<&AdminToken>) -> Outcome {
    let wait = Duration::from_secs(10);
    match ask_json(addr, Method::POST, "/resume", token, wait).await {
        Ok(state) if state["resumed"].as_bool() == Some(true) => Outcome {
            message: "resumed".into(),
            code: 0,
        },
        Ok(_) => Outcome {
            message: "not paused: nothing to resume".into(),
            code: 0,
        },
        Err(message) => Outcome { message, code: 1 },
    }
}

/// Asks, and reads a JSON answer; anything but a 200 is an error naming what the admin said.
async fn ask_json(
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&AdminToken>,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let (status, body) = ask(addr, method, path, token, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_json::from_slice(&body).map_err(|_| {
        format!(
            "the admin listener at {addr} answered {status} with something other than JSON: \
             is it holdfast's?"
        )
    })?;
    if status != StatusCode::OK {
        return Err(format!(
            "the admin listener at {addr} refused ({status}): {}",
            value["error"].as_str().unwrap_or("no reason given")
        ));
    }
    Ok(value)
}
