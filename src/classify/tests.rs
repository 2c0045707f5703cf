//! The classifier's table, row by row.

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
    ] {
        assert!(failed.sent());
        assert_eq!(
            classify(&Outcome::Failed(failed), &cx),
            Verdict::Failed(reason)
        );
    }
    // A body the client broke is the client's failure, not the upstream's (never a 502).
    for fault in [ClientBodyFault::Malformed, ClientBodyFault::Stalled] {
        let failed = FailedSend::ClientBody(fault);
        assert!(failed.sent(), "part of it went: it is never sent again");
        assert_eq!(
            classify(&Outcome::Failed(failed), &cx),
            Verdict::ClientBody(fault)
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
