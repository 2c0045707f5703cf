//! What an upstream outcome means: the one flat, ordered decision.
//!
//! [`classify`] turns one attempt at the upstream (an error, or a response head with at most a
//! peeked body) into a [`Verdict`]. It reads top to bottom in the order of the behaviour table in
//! the README; the proxy acts on the verdict and nothing else decides what the client sees.
//!
//! The distinction that matters most is between *the backend is missing* (the request provably
//! never reached the application: nothing answered, or a router answered by itself) and *the
//! request may have reached the application* (it was sent and then something went wrong). Only the
//! first may be held and replayed. The 503 + Retry-After goes to "missing" verdicts, which
//! include a router's own 502/504 (the issue's row 3: Traefik sends them for dial failures too);
//! those are never replayed, because Traefik also sends them after the backend read the request.

use http::header::HeaderMap;
use http::StatusCode;

use crate::signature::Signature;
use crate::upstream::{ConnectErrorKind, FailedSend};

/// What one attempt at the upstream means for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The application answered: its response passes through untouched.
    Application,
    /// A router answered by itself, but its answer must reach the client as it is.
    RouterPassthrough(PassReason),
    /// The backend is missing: the client gets a 503 with Retry-After.
    Missing(Missing),
    /// The request may have reached the application and then failed, or it cannot be sent for
    /// a reason that waiting does not fix (TLS): 502, never held or replayed.
    Failed(FailReason),
}

/// Why a router's own answer is passed through rather than rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassReason {
    /// The path is not one the application is known to serve, so the 404 is the truth.
    RouteNotExpected,
    /// The route has been missing for longer than the horizon: likely a wrong upstream URL.
    HorizonExceeded,
}

/// A "backend missing" verdict: why, and whether the request provably never reached the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missing {
    /// The reason, also the `reason` label of `holdfast_rewrites_total`.
    pub reason: RewriteReason,
    /// True when the request provably never reached the application.
    pub never_reached_app: bool,
}

impl Missing {
    /// Whether sending this request again cannot execute it twice.
    pub fn is_safe_to_replay(&self) -> bool {
        self.never_reached_app
    }
}

/// Why a response was rewritten to 503. A bounded set: it is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RewriteReason {
    /// TCP connection refused: nothing listens (container gone or starting).
    ConnectRefused,
    /// TCP connect did not complete in time.
    ConnectTimeout,
    /// The upstream host name did not resolve (container removed from DNS).
    Dns,
    /// No route to the host or network.
    Unreachable,
    /// Any other failure while connecting, before a byte of the request was sent.
    ConnectError,
    /// The connection closed before the upstream read any byte of the request: a pooled
    /// connection that a stopped (or killed) backend had closed, or a port that accepted and
    /// closed at once.
    ConnectionClosed,
    /// A router said "no route" with a known 404 signature.
    RouteMissing404,
    /// A router said "no server" / could not dial with a known 5xx signature.
    RouterUnavailable,
    /// holdfast is paused for a planned restart (`holdfast pause`): never a verdict of the
    /// classifier, only the reason of a request held through a pause that got its 503.
    Paused,
    /// The server answered a request with an event stream and ended it without the request's
    /// answer: it is going away (a graceful shutdown ends every stream at once). Never a verdict
    /// of the classifier (it shows only once the stream ends, src/proxy/unanswered.rs); the
    /// upstream-wide outage it opens is probed, like a failed connection, by connecting.
    Unanswered,
    /// The connection broke after a request that is safe to run twice was sent (reset, closed
    /// before the answer), twice in a row: the server is dying or restarting under it. Never a
    /// verdict of the classifier (the same break of any other request is a 502); the proxy
    /// decides it from the request (src/proxy/forward.rs, `broke`). The upstream-wide outage it
    /// opens is probed, like a failed connection, by connecting.
    UpstreamReset,
}

impl RewriteReason {
    /// Every reason, for pre-registering metrics and for docs.
    pub const ALL: [RewriteReason; 11] = [
        RewriteReason::ConnectRefused,
        RewriteReason::ConnectTimeout,
        RewriteReason::Dns,
        RewriteReason::Unreachable,
        RewriteReason::ConnectError,
        RewriteReason::ConnectionClosed,
        RewriteReason::RouteMissing404,
        RewriteReason::RouterUnavailable,
        RewriteReason::Paused,
        RewriteReason::Unanswered,
        RewriteReason::UpstreamReset,
    ];

    /// The reason a failed connection gives: none for a TLS handshake refused on its
    /// certificate or protocol (a configuration error, not a missing backend).
    pub fn of_connect(kind: ConnectErrorKind) -> Option<RewriteReason> {
        Some(match kind {
            ConnectErrorKind::Refused => RewriteReason::ConnectRefused,
            ConnectErrorKind::Timeout => RewriteReason::ConnectTimeout,
            ConnectErrorKind::Dns => RewriteReason::Dns,
            ConnectErrorKind::Unreachable => RewriteReason::Unreachable,
            ConnectErrorKind::Other => RewriteReason::ConnectError,
            ConnectErrorKind::Tls => return None,
        })
    }

    /// Whether the request failed to connect (as opposed to a router answering).
    pub fn is_connect_failure(&self) -> bool {
        !matches!(
            self,
            RewriteReason::RouteMissing404
                | RewriteReason::RouterUnavailable
                | RewriteReason::Paused
        )
    }

    /// The label value and the `holdfast-reason` header value.
    pub fn as_str(&self) -> &'static str {
        match self {
            RewriteReason::ConnectRefused => "connect_refused",
            RewriteReason::ConnectTimeout => "connect_timeout",
            RewriteReason::Dns => "dns",
            RewriteReason::Unreachable => "unreachable",
            RewriteReason::ConnectError => "connect_error",
            RewriteReason::ConnectionClosed => "connection_closed",
            RewriteReason::RouteMissing404 => "route_missing_404",
            RewriteReason::RouterUnavailable => "router_unavailable",
            RewriteReason::Paused => "paused",
            RewriteReason::Unanswered => "unanswered",
            RewriteReason::UpstreamReset => "upstream_reset",
        }
    }
}

/// Why a request failed with a 502: it may have reached the application, or (TLS) it cannot be
/// sent at all until someone fixes a certificate or the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// No response headers within `client.response_timeout_secs`.
    ResponseTimeout,
    /// The connection broke after the request was (partly) sent.
    UpstreamReset,
    /// The upstream sent something that is not HTTP.
    Protocol,
    /// The client's request body failed while it was being forwarded.
    ClientBody,
    /// TLS to the upstream failed: its certificate is not trusted or not for its name, it
    /// refused holdfast's client certificate, or no protocol version or cipher suite is shared.
    /// A configuration error that no retry fixes.
    UpstreamTls,
    /// The server answered with an event stream and ended it without the request's answer (a
    /// graceful shutdown): the request reached it and may have run.
    Unanswered,
}

impl FailReason {
    /// Short name for logs and the `holdfast-reason` header.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailReason::ResponseTimeout => "response_timeout",
            FailReason::UpstreamReset => "upstream_reset",
            FailReason::Protocol => "upstream_protocol",
            FailReason::ClientBody => "client_body",
            FailReason::UpstreamTls => "upstream_tls",
            FailReason::Unanswered => "unanswered",
        }
    }
}

/// One attempt's outcome, as the classifier sees it.
pub enum Outcome<'a> {
    /// Sending failed, as decided where it failed.
    Failed(FailedSend),
    /// The response headers arrived waiting longer than allowed.
    ResponseTimeout,
    /// A response arrived. `body` is the complete body when it was peeked (a candidate status
    /// with a small enough body), `None` when it was not read.
    Response {
        /// Response status.
        status: StatusCode,
        /// Response headers.
        headers: &'a HeaderMap,
        /// The complete body, if peeked.
        body: Option<&'a [u8]>,
    },
}

/// What the classifier needs to know about the request and the upstream's recent history.
pub struct Context<'a> {
    /// Active signatures, in order.
    pub signatures: &'a [Signature],
    /// Whether the application is expected to serve this request's path.
    pub route_expected: bool,
    /// Whether the last healthy answer is older than the horizon.
    pub beyond_horizon: bool,
}

/// The decision, top to bottom. The first matching row wins.
pub fn classify(outcome: &Outcome<'_>, cx: &Context<'_>) -> Verdict {
    match outcome {
        // 1a. The TLS handshake with the upstream failed on a certificate or the protocol
        //     (untrusted, wrong name, expired, client certificate refused, nothing in common).
        //     Nothing was sent, but a restarting container does not cause this and waiting does
        //     not fix it: it is a configuration error, answered 502 at once and never held.
        //     (A TLS connection that fails on I/O, refused or timed out, is row 1.)
        // 1. The connection failed before anything was sent: the backend is missing, and the
        //    request certainly never reached it.
        Outcome::Failed(FailedSend::NotConnected(kind)) => match RewriteReason::of_connect(*kind) {
            None => Verdict::Failed(FailReason::UpstreamTls),
            Some(reason) => Verdict::Missing(Missing {
                reason,
                never_reached_app: true,
            }),
        },

        // 1b. The connection closed before the upstream read any byte of the request, as the
        //     kernel shows (the pooled connection handed it back unwritten, or the upstream's TCP acknowledged
        //     none of it): the backend stopped or is starting, and the request never reached it.
        Outcome::Failed(FailedSend::NeverRead) => Verdict::Missing(Missing {
            reason: RewriteReason::ConnectionClosed,
            never_reached_app: true,
        }),

        // 2. and 3. A router answered by itself (a known signature).
        Outcome::Response {
            status,
            headers,
            body,
        } => match cx
            .signatures
            .iter()
            .find(|s| s.matches(*status, headers, *body))
        {
            // A router's 404 on a path the application is not known to serve is the truth
            // (e.g. OAuth discovery under /.well-known/ when only /mcp is routed).
            Some(sig) if sig.is_route_missing() && !cx.route_expected => {
                Verdict::RouterPassthrough(PassReason::RouteNotExpected)
            }
            // Missing for longer than the horizon: a wrong upstream must surface, not hide.
            Some(sig) if sig.is_route_missing() && cx.beyond_horizon => {
                Verdict::RouterPassthrough(PassReason::HorizonExceeded)
            }
            Some(sig) => Verdict::Missing(Missing {
                reason: if sig.is_route_missing() {
                    RewriteReason::RouteMissing404
                } else {
                    RewriteReason::RouterUnavailable
                },
                never_reached_app: sig.replay_safe,
            }),
            // 4. Everything else is the application's own answer, whatever its status.
            None => Verdict::Application,
        },

        // 5. Sent, then no answer in time: it may be executing right now.
        Outcome::ResponseTimeout => Verdict::Failed(FailReason::ResponseTimeout),
        // 6. Sent, then failed: the application may have executed it.
        Outcome::Failed(FailedSend::ClientBody) => Verdict::Failed(FailReason::ClientBody),
        Outcome::Failed(FailedSend::Tls) => Verdict::Failed(FailReason::UpstreamTls),
        Outcome::Failed(FailedSend::Protocol) => Verdict::Failed(FailReason::Protocol),
        Outcome::Failed(FailedSend::Broke) => Verdict::Failed(FailReason::UpstreamReset),
    }
}

mod routes;
pub use routes::{ExpectedRoutes, LegacyPaths};

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::{Preset, RawHeaderMatch, RawSignature};
    use http::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn presets() -> Vec<Signature> {
        crate::config::defaults::PRESETS
            .iter()
            .map(|n| Preset::from_name(n).unwrap().signature())
            .collect()
    }

    fn verdict(status: u16, h: &HeaderMap, body: &[u8], expected: bool, beyond: bool) -> Verdict {
        let sigs = presets();
        classify(
            &Outcome::Response {
                status: StatusCode::from_u16(status).unwrap(),
                headers: h,
                body: Some(body),
            },
            &Context {
                signatures: &sigs,
                route_expected: expected,
                beyond_horizon: beyond,
            },
        )
    }

    const TRAEFIK: &[(&str, &str)] = &[
        ("content-type", "text/plain; charset=utf-8"),
        ("x-content-type-options", "nosniff"),
    ];

    #[test]
    fn traefik_404_is_missing_only_when_expected_and_within_horizon() {
        let h = headers(TRAEFIK);
        let missing = Verdict::Missing(Missing {
            reason: RewriteReason::RouteMissing404,
            never_reached_app: true,
        });
        assert_eq!(
            verdict(404, &h, b"404 page not found\n", true, false),
            missing
        );
        assert_eq!(
            verdict(404, &h, b"404 page not found\n", false, false),
            Verdict::RouterPassthrough(PassReason::RouteNotExpected)
        );
        assert_eq!(
            verdict(404, &h, b"404 page not found\n", true, true),
            Verdict::RouterPassthrough(PassReason::HorizonExceeded)
        );
    }

    #[test]
    fn near_misses_of_traefik_are_the_application() {
        let h = headers(TRAEFIK);
        // Trailing newline missing, different text, or a header missing: not Traefik.
        assert_eq!(
            verdict(404, &h, b"404 page not found", true, false),
            Verdict::Application
        );
        assert_eq!(
            verdict(404, &h, b"Session not found\n", true, false),
            Verdict::Application
        );
        let no_nosniff = headers(&[("content-type", "text/plain; charset=utf-8")]);
        assert_eq!(
            verdict(404, &no_nosniff, b"404 page not found\n", true, false),
            Verdict::Application
        );
        // Same bytes, other status.
        assert_eq!(
            verdict(410, &h, b"404 page not found\n", true, false),
            Verdict::Application
        );
    }

    #[test]
    fn mcp_servers_own_404s_are_the_application() {
        let json = headers(&[("content-type", "application/json")]);
        let ts =
            br#"{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}"#;
        assert_eq!(verdict(404, &json, ts, true, false), Verdict::Application);
        let m = br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}"#;
        assert_eq!(verdict(404, &json, m, true, false), Verdict::Application);
        // rmcp: no Content-Type at all.
        let none = HeaderMap::new();
        assert_eq!(
            verdict(404, &none, b"Not Found: Session not found", true, false),
            Verdict::Application
        );
        // An unread body never matches a body signature.
        let sigs = presets();
        let v = classify(
            &Outcome::Response {
                status: StatusCode::NOT_FOUND,
                headers: &headers(TRAEFIK),
                body: None,
            },
            &Context {
                signatures: &sigs,
                route_expected: true,
                beyond_horizon: false,
            },
        );
        assert_eq!(v, Verdict::Application);
    }

    #[test]
    fn router_5xx_signatures() {
        let h = HeaderMap::new();
        assert_eq!(
            verdict(503, &h, b"no available server\n", true, false),
            Verdict::Missing(Missing {
                reason: RewriteReason::RouterUnavailable,
                never_reached_app: true
            })
        );
        // Not replay-safe, but still "missing" (503 + Retry-After), even past the horizon:
        // the horizon only un-masks 404s.
        assert_eq!(
            verdict(502, &h, b"Bad Gateway", true, true),
            Verdict::Missing(Missing {
                reason: RewriteReason::RouterUnavailable,
                never_reached_app: false
            })
        );
        // The application's own 5xx.
        assert_eq!(verdict(503, &h, b"busy", true, false), Verdict::Application);
        assert_eq!(verdict(500, &h, b"boom", true, false), Verdict::Application);
    }

    #[test]
    fn nginx_error_pages_are_the_routers_and_never_replay_safe() {
        let html = headers(&[("content-type", "text/html")]);
        let not_safe = Verdict::Missing(Missing {
            reason: RewriteReason::RouterUnavailable,
            never_reached_app: false,
        });
        for (status, title) in [
            (502, "Bad Gateway"),
            (503, "Service Temporarily Unavailable"),
            (504, "Gateway Time-out"),
        ] {
            // With its version, and without (server_tokens off).
            for foot in ["nginx/1.22.1", "nginx"] {
                let page = format!("<html>\r\n<head><title>{status} {title}</title></head>\r\n<body>\r\n<center><h1>{status} {title}</h1></center>\r\n<hr><center>{foot}</center>\r\n</body>\r\n</html>\r\n");
                assert_eq!(
                    verdict(status, &html, page.as_bytes(), true, false),
                    not_safe
                );
            }
        }
        // The application's own HTML 502 is its answer.
        assert_eq!(
            verdict(502, &html, b"<h1>upstream said no</h1>", true, false),
            Verdict::Application
        );
    }

    #[test]
    fn other_presets() {
        let html = headers(&[("content-type", "text/html")]);
        let page = b"<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>\r\n";
        assert!(matches!(
            verdict(404, &html, page, true, false),
            Verdict::Missing(_)
        ));
        let plain = headers(&[("content-type", "text/plain")]);
        assert!(matches!(
            verdict(404, &plain, b"default backend - 404", true, false),
            Verdict::Missing(_)
        ));
        // Envoy's preset is off by default: an empty 404 is the application's.
        let envoy = headers(&[("server", "envoy")]);
        assert_eq!(verdict(404, &envoy, b"", true, false), Verdict::Application);
        let sigs = vec![Preset::Envoy404.signature()];
        let v = classify(
            &Outcome::Response {
                status: StatusCode::NOT_FOUND,
                headers: &envoy,
                body: Some(b""),
            },
            &Context {
                signatures: &sigs,
                route_expected: true,
                beyond_horizon: false,
            },
        );
        assert!(matches!(v, Verdict::Missing(_)));
    }

    #[test]
    fn failed_connections_are_missing_and_sent_requests_failed() {
        let sigs = presets();
        let cx = Context {
            signatures: &sigs,
            route_expected: true,
            beyond_horizon: false,
        };
        for (kind, reason) in [
            (ConnectErrorKind::Refused, RewriteReason::ConnectRefused),
            (ConnectErrorKind::Timeout, RewriteReason::ConnectTimeout),
            (ConnectErrorKind::Dns, RewriteReason::Dns),
            (ConnectErrorKind::Unreachable, RewriteReason::Unreachable),
            (ConnectErrorKind::Other, RewriteReason::ConnectError),
        ] {
            assert_eq!(
                classify(&Outcome::Failed(FailedSend::NotConnected(kind)), &cx),
                Verdict::Missing(Missing {
                    reason,
                    never_reached_app: true
                })
            );
        }
        assert_eq!(
            classify(&Outcome::Failed(FailedSend::NeverRead), &cx),
            Verdict::Missing(Missing {
                reason: RewriteReason::ConnectionClosed,
                never_reached_app: true
            })
        );
        // A refused handshake is a configuration error, not a missing backend; so is a TLS
        // alert read after the request was written (TLS 1.3 client certificates).
        for failed in [
            FailedSend::NotConnected(ConnectErrorKind::Tls),
            FailedSend::Tls,
        ] {
            assert_eq!(
                classify(&Outcome::Failed(failed), &cx),
                Verdict::Failed(FailReason::UpstreamTls)
            );
        }
        for (failed, reason) in [
            (FailedSend::Broke, FailReason::UpstreamReset),
            (FailedSend::Protocol, FailReason::Protocol),
            (FailedSend::ClientBody, FailReason::ClientBody),
        ] {
            assert!(failed.sent());
            assert_eq!(
                classify(&Outcome::Failed(failed), &cx),
                Verdict::Failed(reason)
            );
        }
        assert_eq!(
            classify(&Outcome::ResponseTimeout, &cx),
            Verdict::Failed(FailReason::ResponseTimeout)
        );
    }

    #[test]
    fn user_signatures_are_validated() {
        let ok = RawSignature {
            name: "caddy".into(),
            status: 404,
            body: Some("nope".into()),
            ..Default::default()
        };
        assert!(Signature::from_raw(&ok).is_ok());
        let bare = RawSignature {
            status: 404,
            ..Default::default()
        };
        assert!(Signature::from_raw(&bare)
            .unwrap_err()
            .contains("at least one"));
        let ok200 = RawSignature {
            status: 200,
            body: Some("".into()),
            ..Default::default()
        };
        assert!(Signature::from_raw(&ok200).unwrap_err().contains("404"));
        let both = RawSignature {
            status: 404,
            body: Some("a".into()),
            body_contains: Some("a".into()),
            ..Default::default()
        };
        assert!(Signature::from_raw(&both).unwrap_err().contains("not both"));
    }

    #[test]
    fn user_signature_with_headers_and_no_content_type() {
        let raw = RawSignature {
            status: 404,
            content_type: Some(String::new()),
            headers: vec![RawHeaderMatch {
                name: "X-Router".into(),
                value: None,
            }],
            ..Default::default()
        };
        let sig = Signature::from_raw(&raw).unwrap();
        let h = headers(&[("x-router", "edge-1")]);
        assert!(sig.matches(StatusCode::NOT_FOUND, &h, None));
        let h2 = headers(&[("x-router", "edge-1"), ("content-type", "text/plain")]);
        assert!(!sig.matches(StatusCode::NOT_FOUND, &h2, None));
    }
}
