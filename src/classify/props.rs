//! Properties of [`classify`] over generated upstream answers: what it must never do whatever
//! the upstream sends. The unit tests beside it pin the table row by row; these look for the
//! answer nobody thought to write down. (Failed sends are read where they fail:
//! src/upstream/failed.rs has their property.)

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use proptest::prelude::*;

use super::{classify, Context, Outcome, Verdict};
use crate::signature::{Preset, Signature};

const TRAEFIK_404: &[u8] = b"404 page not found\n";

fn presets() -> Vec<Signature> {
    crate::config::defaults::PRESETS
        .iter()
        .map(|n| Preset::from_name(n).unwrap().signature())
        .collect()
}

fn verdict(status: u16, headers: &HeaderMap, body: &[u8], sigs: &[Signature]) -> Verdict {
    classify(
        &Outcome::Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: Some(body),
        },
        &Context {
            signatures: sigs,
            route_expected: true,
            beyond_horizon: false,
        },
    )
}

/// Response headers as upstreams send them: a content type or none, and some of the headers
/// routers and applications add.
fn any_headers() -> impl Strategy<Value = HeaderMap> {
    let content_type = prop::option::of(prop::sample::select(vec![
        "text/plain; charset=utf-8",
        "text/plain",
        "TEXT/PLAIN; CHARSET=UTF-8",
        "text/html",
        "application/json",
        "text/event-stream",
        "",
    ]));
    let extra = prop::collection::vec(
        (
            prop::sample::select(vec![
                "x-content-type-options",
                "server",
                "mcp-session-id",
                "www-authenticate",
                "cache-control",
                "x-request-id",
            ]),
            prop::sample::select(vec!["nosniff", "traefik", "s-1", "Bearer", "no-cache", ""]),
        ),
        0..4,
    );
    (content_type, extra).prop_map(|(content_type, extra)| {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert("content-type", HeaderValue::from_static(ct));
        }
        for (name, value) in extra {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        headers
    })
}

/// A body: one of the routers' own, an application's, or arbitrary bytes.
fn any_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(TRAEFIK_404.to_vec()),
        Just(b"404 page not found".to_vec()),
        Just(b"no available server\n".to_vec()),
        Just(Vec::new()),
        Just(
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Session not found"}}"#
                .to_vec()
        ),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// A changed copy of `body`: one byte flipped, dropped or added.
fn mutated(body: &[u8], at: usize, how: u8) -> Vec<u8> {
    let mut out = body.to_vec();
    let at = at % (out.len() + 1);
    match how % 3 {
        0 if at < out.len() => out[at] ^= 0x20,
        1 if at < out.len() => {
            out.remove(at);
        }
        _ => out.insert(at, b'x'),
    }
    out
}

proptest! {
    /// Only 404s and the routers' 5xx statuses are ever taken for a router: any other status is
    /// the application's answer, whatever its headers and body.
    #[test]
    fn other_statuses_are_always_the_applications(
        status in 100u16..600,
        headers in any_headers(),
        body in any_body(),
    ) {
        prop_assume!(![404, 502, 503, 504].contains(&status));
        prop_assert_eq!(verdict(status, &headers, &body, &presets()), Verdict::Application);
    }

    /// A 404 that differs from Traefik's by one byte of its body is the application's, and
    /// passes: no near miss is masked.
    #[test]
    fn a_404_unlike_a_routers_by_one_byte_is_never_masked(
        at in 0usize..32,
        how in any::<u8>(),
        headers in any_headers(),
    ) {
        let body = mutated(TRAEFIK_404, at, how);
        prop_assert_eq!(verdict(404, &headers, &body, &presets()), Verdict::Application);
    }

    /// Traefik's exact 404, with whatever else a router adds, is masked, and as never having
    /// reached the application.
    #[test]
    fn traefiks_exact_404_is_masked_as_never_sent(
        extra in prop::collection::vec(
            (prop::sample::select(vec!["date", "server", "x-request-id"]), "[a-z0-9]{0,8}"),
            0..3,
        ),
    ) {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain; charset=utf-8"));
        headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
        for (name, value) in extra {
            headers.append(HeaderName::from_static(name), HeaderValue::from_str(&value).unwrap());
        }
        match verdict(404, &headers, TRAEFIK_404, &presets()) {
            Verdict::Missing(m) => prop_assert!(m.never_reached_app),
            other => prop_assert!(false, "not masked: {other:?}"),
        }
    }

    /// A 5xx is proof that the request was not sent only when it is Traefik's exact "no
    /// available server" 503 (it had no server to send it to); a router's 502/504 also follows
    /// a request the backend read, and nothing else a 5xx says proves anything.
    #[test]
    fn no_5xx_but_the_no_server_503_makes_a_request_replay_safe(
        status in 500u16..600,
        headers in any_headers(),
        body in any_body(),
    ) {
        if let Verdict::Missing(m) = verdict(status, &headers, &body, &presets()) {
            if m.never_reached_app {
                prop_assert_eq!(status, 503);
                prop_assert_eq!(&body[..], &b"no available server\n"[..]);
            }
        }
    }
}

#[test]
fn a_response_timeout_is_never_replay_safe() {
    let sigs = presets();
    let cx = Context {
        signatures: &sigs,
        route_expected: true,
        beyond_horizon: false,
    };
    assert!(matches!(
        classify(&Outcome::ResponseTimeout, &cx),
        Verdict::Failed(_)
    ));
}
