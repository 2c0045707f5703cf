//! Properties of the request-head functions over generated heads: hop-by-hop stripping, the
//! X-Forwarded-* lists, Host checking and dot-segment refusal. Each states what must hold for
//! any input, checked against an oracle written independently of the code under test.

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue, HOST};
use http::{Uri, Version};
use proptest::prelude::*;

use super::headers::{add_forwarded, strip_hop_by_hop};
use super::request::{check_path, client_host};

/// Always hop-by-hop, whatever `Connection` says.
const FIXED_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Names a head may carry: the fixed hop-by-hop ones, MCP's end-to-end ones, others.
fn name() -> impl Strategy<Value = &'static str> {
    let end_to_end = [
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
        "authorization",
        "content-type",
        "x-custom",
        "x-trace",
        "accept",
    ];
    prop::sample::select(
        FIXED_HOP
            .iter()
            .copied()
            .chain(end_to_end)
            .collect::<Vec<_>>(),
    )
}

/// A `Connection` value: names (any case, any spacing), comma-separated, perhaps empty items.
fn connection_value() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (
            prop::sample::select(vec![
                "close",
                "keep-alive",
                "x-custom",
                "X-Trace",
                "upgrade",
            ]),
            prop::sample::select(vec!["", " ", "  "]),
        ),
        0..4,
    )
    .prop_map(|items| {
        items
            .into_iter()
            .map(|(n, pad)| format!("{pad}{n}{pad}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

fn head() -> impl Strategy<Value = Vec<(String, String)>> {
    let line = prop_oneof![
        3 => (name(), "[a-z0-9]{0,6}").prop_map(|(n, v)| (n.to_string(), v)),
        1 => connection_value().prop_map(|v| ("connection".to_string(), v)),
    ];
    prop::collection::vec(line, 0..10)
}

fn to_map(lines: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (n, v) in lines {
        map.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

/// The list items of every line of `name`, trimmed, empty ones dropped.
fn items(map: &HeaderMap, name: &str) -> Vec<String> {
    map.get_all(name)
        .iter()
        .flat_map(|v| v.to_str().unwrap().split(','))
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .collect()
}

proptest! {
    /// After stripping: no fixed hop-by-hop header and nothing `Connection` named is left, and
    /// every other header is there with all its values in their order.
    #[test]
    fn stripping_removes_exactly_the_hop_by_hop_headers(lines in head()) {
        let before = to_map(&lines);
        let named: Vec<String> = items(&before, "connection")
            .into_iter()
            .map(|n| n.to_ascii_lowercase())
            .collect();
        let mut after = before.clone();
        strip_hop_by_hop(&mut after);
        for (name, _) in &lines {
            let hop = FIXED_HOP.contains(&name.as_str()) || named.contains(name);
            let kept: Vec<_> = after.get_all(name.as_str()).iter().collect();
            if hop {
                prop_assert!(kept.is_empty(), "{name} survived: {after:?}");
            } else {
                let was: Vec<_> = before.get_all(name.as_str()).iter().collect();
                prop_assert_eq!(kept, was, "{} changed", name);
            }
        }
        prop_assert!(after.len() <= before.len());
    }

    /// X-Forwarded-For, -Proto and -Host each become one line: the items the client sent, in
    /// order, then this hop's; nothing else changes.
    #[test]
    fn forwarded_lists_append_this_hop(
        fors in prop::collection::vec("(10|192)\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}( ?, ?[0-9a-f:]{2,8})?", 0..3),
        protos in prop::collection::vec(prop::sample::select(vec!["http", "https", " https ", ""]), 0..3),
        host in prop::option::of("[a-z]{1,8}\\.example(:[0-9]{2,4})?"),
        peer in any::<IpAddr>(),
        other in "[a-z]{0,8}",
    ) {
        let mut map = HeaderMap::new();
        for v in &fors {
            map.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        for v in &protos {
            map.append("x-forwarded-proto", HeaderValue::from_str(v).unwrap());
        }
        map.insert("x-other", HeaderValue::from_str(&other).unwrap());
        let (for_before, proto_before) = (items(&map, "x-forwarded-for"), items(&map, "x-forwarded-proto"));

        let host_value = host.as_deref().map(|h| HeaderValue::from_str(h).unwrap());
        add_forwarded(&mut map, peer, "https", host_value);

        prop_assert_eq!(map.get_all("x-forwarded-for").iter().count(), 1);
        let mut want = for_before;
        want.push(peer.to_string());
        prop_assert_eq!(items(&map, "x-forwarded-for"), want);
        let mut want = proto_before;
        want.push("https".to_string());
        prop_assert_eq!(items(&map, "x-forwarded-proto"), want);
        prop_assert_eq!(items(&map, "x-forwarded-host"), host.into_iter().collect::<Vec<_>>());
        prop_assert_eq!(map.get("x-other").unwrap().to_str().unwrap(), other.as_str());
    }

    /// An HTTP/1.1 request is accepted with exactly one Host that is a plain `host[:port]`
    /// (a port of digits that fits 16 bits), and that Host is what goes on; anything else is
    /// refused.
    #[test]
    fn http11_needs_exactly_one_plain_host(
        hosts in prop::collection::vec(
            (
                "[a-z0-9]{1,6}(\\.[a-z0-9]{1,6}){0,2}",
                prop::option::of(0u32..99_999),
                prop::sample::select(vec!["", "user@", "/x", " y", "?q"]),
            ),
            0..3,
        ),
    ) {
        let mut map = HeaderMap::new();
        let mut values = Vec::new();
        for (name, port, decoration) in &hosts {
            let value = match port {
                Some(p) => format!("{name}:{p}"),
                None => name.clone(),
            };
            let value = if decoration.ends_with('@') {
                format!("{decoration}{value}")
            } else {
                format!("{value}{decoration}")
            };
            map.append(HOST, HeaderValue::from_str(&value).unwrap());
            values.push(value);
        }
        let plain = |(_, port, decoration): &(String, Option<u32>, &str)| {
            decoration.is_empty() && port.is_none_or(|p| p <= 65_535)
        };
        let got = client_host(Version::HTTP_11, &Uri::from_static("/mcp"), &map);
        if hosts.len() == 1 && plain(&hosts[0]) {
            prop_assert_eq!(got.unwrap().unwrap(), values[0].as_str());
        } else {
            prop_assert!(got.is_err(), "{values:?} accepted");
        }
    }

    /// A path is refused exactly when one of its segments is `.` or `..` (also percent-encoded,
    /// any case); other dots pass.
    #[test]
    fn dot_segments_are_refused_and_nothing_else(
        segments in prop::collection::vec(
            prop::sample::select(vec![
                "mcp", "a", "", ".", "..", "%2e", "%2E", "%2e%2E", ".%2e", "...", "a.b", ".well-known", "x..",
            ]),
            0..6,
        ),
    ) {
        let path = format!("/{}", segments.join("/"));
        let dot = segments.iter().any(|s| {
            let lower = s.to_ascii_lowercase();
            lower == "." || lower == ".." || lower == "%2e" || lower == "%2e%2e" || lower == ".%2e"
        });
        prop_assert_eq!(check_path(&path).is_err(), dot, "{}", path);
    }
}
