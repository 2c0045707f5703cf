//! `[peers]`: the other replicas a terminating holdfast hands to what never reached a server.
//!
//! `urls` lists their proxy URLs (the same list for every replica: a holdfast recognises itself
//! in it by the answer it gets, see `proxy/handoff.rs`); as an environment variable the URLs are
//! separated by commas (`HOLDFAST_PEERS__URLS=http://10.0.0.5:8080,http://10.0.0.6:8080`). `dns`
//! names them instead, as `host:port` resolved when a hand-off happens (a headless Service).

use std::fmt;

use http::Uri;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::validate::Validator;

/// `[peers]` as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawPeers {
    /// The other replicas' proxy URLs (`http://host:port`): a list, or one string of
    /// comma-separated URLs.
    #[serde(deserialize_with = "urls")]
    pub urls: Vec<String>,
    /// `host:port` whose addresses are the replicas (a headless Service), resolved at use.
    pub dns: String,
}

/// Validated `[peers]`.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    /// The replicas named by URL.
    pub urls: Vec<Uri>,
    /// The replicas named by a DNS name: host and port.
    pub dns: Option<(String, u16)>,
}

impl Peers {
    /// Whether any peer is named.
    pub fn any(&self) -> bool {
        !self.urls.is_empty() || self.dns.is_some()
    }
}

/// A list of strings, or one string of comma-separated items (an environment variable's).
fn urls<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Urls;
    impl<'de> Visitor<'de> for Urls {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of URLs, or URLs separated by commas")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<String>, E> {
            Ok(v.split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut out = Vec::new();
            while let Some(url) = seq.next_element::<String>()? {
                out.push(url);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Urls)
}

impl Validator<'_> {
    /// Validates `[peers]`: every URL `http://host:port` with no path, a DNS name with a port.
    pub(super) fn peers(&mut self, raw: &RawPeers) -> Option<Peers> {
        let mut ok = true;
        let mut urls = Vec::new();
        for text in &raw.urls {
            match peer_url(text) {
                Ok(uri) => urls.push(uri),
                Err(e) => {
                    ok = false;
                    self.fail::<()>("peers.urls", e);
                }
            }
        }
        let dns = if raw.dns.is_empty() {
            None
        } else {
            match raw.dns.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>())) {
                Some((host, Ok(port))) if !host.is_empty() && port != 0 => {
                    Some((host.to_owned(), port))
                }
                _ => {
                    ok = false;
                    self.fail::<()>(
                        "peers.dns",
                        format!(
                            "expected host:port (a headless Service's name), got `{}`",
                            raw.dns
                        ),
                    );
                    None
                }
            }
        };
        ok.then_some(Peers { urls, dns })
    }
}

/// A peer's proxy URL: `http://host:port`, nothing after.
fn peer_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    // Plain HTTP: peers are reached over the pod or host network, and a hand-off's client is
    // built without TLS settings of its own.
    let scheme_ok = uri.scheme_str() == Some("http");
    let path_ok = uri
        .path_and_query()
        .is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty());
    if !scheme_ok || uri.authority().is_none() || !path_ok {
        return Err(format!(
            "`{text}`: a peer is named by its proxy's base URL, http://host:port (plain HTTP)"
        ));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_come_as_a_list_or_comma_separated() {
        let from_list: RawPeers =
            serde_json::from_str(r#"{"urls":["http://a:8080","http://b:8080"]}"#).unwrap();
        let from_text: RawPeers =
            serde_json::from_str(r#"{"urls":"http://a:8080, http://b:8080,"}"#).unwrap();
        assert_eq!(from_list.urls, from_text.urls);
        assert_eq!(from_text.urls, ["http://a:8080", "http://b:8080"]);
    }

    #[test]
    fn a_peer_is_a_base_url() {
        assert!(peer_url("http://10.0.0.5:8080").is_ok());
        assert!(peer_url("http://holdfast-1.ns:8080/").is_ok());
        for bad in [
            "10.0.0.5:8080",
            "ftp://a:1",
            "https://a:8443",
            "http://a:8080/mcp",
            "http://",
        ] {
            assert!(peer_url(bad).is_err(), "{bad}");
        }
    }
}
