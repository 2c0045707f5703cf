//! Phase two: every raw value checked, every problem reported at once with its key and the layer
//! it came from, and the validated [`Config`] built.

use super::*;

impl Config {
    /// Extracts the raw layer from `fig` and validates it, naming origins from `fig`'s metadata.
    ///
    /// serde stops at the first unknown key or mistyped value, so extraction is repeated with
    /// each offending key removed until it succeeds; validation then runs on the rest, and every
    /// problem found on the way is reported together.
    pub fn from_figment(fig: &Figment) -> Result<Config, ConfigError> {
        let origin = |key: &str| describe_origin(key, fig.find_metadata(key));
        // Reading the layers themselves (a missing file, TOML syntax) is fatal: there is nothing
        // to validate.
        let mut data: figment::value::Dict = fig.extract().map_err(|e| ConfigError {
            problems: e
                .into_iter()
                .map(|e| Problem {
                    key: "(configuration)".into(),
                    origin: e
                        .metadata
                        .as_ref()
                        .map(|md| describe_origin("", Some(md)))
                        .unwrap_or_else(|| "configuration".into()),
                    message: super::messages::describe(&e.kind).trim().to_string(),
                })
                .collect(),
        })?;
        let mut problems = Vec::new();
        let raw = loop {
            match Figment::from(Serialized::defaults(&data)).extract::<RawConfig>() {
                Ok(raw) => break raw,
                Err(errors) => {
                    let mut removed_any = false;
                    for e in errors {
                        let key = e.path.join(".");
                        problems.push(Problem {
                            origin: origin(&key),
                            key: if key.is_empty() {
                                "(top level)".into()
                            } else {
                                key
                            },
                            message: super::messages::describe(&e.kind),
                        });
                        removed_any |= remove_path(&mut data, &e.path);
                    }
                    if !removed_any {
                        return Err(ConfigError { problems });
                    }
                }
            }
        };
        match Config::from_raw(&raw, &origin) {
            Ok(mut config) if problems.is_empty() => {
                config.log_level_said = origin("log_level") != ORIGIN_DEFAULT;
                Ok(config)
            }
            Ok(_) => Err(ConfigError { problems }),
            Err(e) => {
                // A removed key falls back to its default, which may fail validation again
                // (`upstream`): report each key once.
                for p in e.problems {
                    if !problems.iter().any(|q| q.key == p.key) {
                        problems.push(p);
                    }
                }
                Err(ConfigError { problems })
            }
        }
    }

    /// Validates `raw`. `origin(key)` names the layer a key came from, for error messages.
    ///
    /// Long on purpose: each section's validator, then one line per field of `Config`.
    pub fn from_raw(
        raw: &RawConfig,
        origin: &dyn Fn(&str) -> String,
    ) -> Result<Config, ConfigError> {
        let mut v = Validator {
            problems: Vec::new(),
            origin,
        };

        let listen = v.socket_addr("listen", &raw.listen);
        let admin = v.socket_addr("admin", &raw.admin);
        let upstream = v.upstream("upstream", &raw.upstream);
        let tls = v.inbound_tls(&raw.tls);
        let (log_format, log_level) = v.logging(raw);
        let host_header = v.host_header(&raw.client.host_header);
        // `[client]`'s trust and certificate serve a store over TLS too (`rediss://`).
        let store_tls = raw
            .sessions
            .store
            .as_deref()
            .is_some_and(super::sessions::store_is_tls);
        let upstream_tls = match &upstream {
            Some(u) => v.upstream_tls(&raw.client, u, host_header, store_tls),
            None => None,
        };
        if raw.retry_after_secs == 0 {
            v.fail::<()>("retry_after_secs", "must be at least 1".into());
        }
        let connect_timeout = v.secs(
            "client.connect_timeout_secs",
            raw.client.connect_timeout_secs,
        );
        let response_timeout = v.secs(
            "client.response_timeout_secs",
            raw.client.response_timeout_secs,
        );
        let pool_idle_timeout = v.secs(
            "client.pool_idle_timeout_secs",
            raw.client.pool_idle_timeout_secs,
        );
        let stream_idle_timeout =
            v.secs("streams.idle_timeout_secs", raw.streams.idle_timeout_secs);
        let (header_read_timeout, h2_ping_interval) = v.limits(&raw.limits);
        let (drain_timeout, accept_grace) = v.shutdown(&raw.shutdown);
        let hold = v.hold(&raw.hold);

        let routes = v.routes(&raw.routes);
        if let (Some(upstream), Some(routes)) = (&upstream, &routes) {
            v.upstream_path(upstream, &routes.endpoints);
        }
        let mut sessions = v.sessions(&raw.sessions);
        if let Some(s) = sessions.as_mut() {
            if s.store
                .as_deref()
                .is_some_and(super::sessions::store_is_tls)
            {
                s.store_tls = v.store_tls(&raw.client);
            }
        }
        let retry = v.retry(&raw.retry);
        let pause = v.pause(&raw.pause);
        let peers = v.peers(&raw.peers);
        let trusted_proxies = v.forwarded(&raw.forwarded);
        let admin_token = v.admin_token(raw.admin_token_file.as_deref());
        let request_id = v.request_id(&raw.request_id);
        let tracing = v.tracing(&raw.tracing);
        let bridge = v.bridge(&raw.bridge);
        if !v.problems.is_empty() {
            return Err(ConfigError {
                problems: v.problems,
            });
        }
        // Every Option below is Some: a None always recorded a problem above.
        let ok = "validated above";
        Ok(Config {
            listen: listen.expect(ok),
            admin: admin.expect(ok),
            upstream: upstream.expect(ok),
            retry_after: Duration::from_secs(raw.retry_after_secs),
            log_format: log_format.expect(ok),
            log_level: log_level.expect(ok),
            // Known only to a figment: `from_figment` sets it.
            log_level_said: false,
            access_log: raw.access_log,
            host_header: host_header.expect(ok),
            connect_timeout: connect_timeout.expect(ok),
            response_timeout: response_timeout.expect(ok),
            pool_idle_timeout: pool_idle_timeout.expect(ok),
            stream_idle_timeout: stream_idle_timeout.expect(ok),
            routes: routes.expect(ok),
            max_header_bytes: raw.limits.max_header_bytes,
            header_read_timeout: header_read_timeout.expect(ok),
            max_connections: raw.limits.max_connections,
            max_headers: raw.limits.max_headers,
            h2_ping_interval: h2_ping_interval.expect(ok),
            drain_timeout: drain_timeout.expect(ok),
            accept_grace: accept_grace.expect(ok),
            hold: hold.expect(ok),
            tls,
            upstream_tls,
            sessions: sessions.expect(ok),
            retry: retry.expect(ok),
            pause: pause.expect(ok),
            peers: peers.expect(ok),
            admin_token: admin_token.expect(ok),
            trusted_proxies: trusted_proxies.expect(ok),
            request_id: request_id.expect(ok),
            tracing: tracing.expect(ok),
            bridge: bridge.expect(ok),
        })
    }
}

/// Collects problems while validating.
pub(super) struct Validator<'a> {
    problems: Vec<Problem>,
    origin: &'a dyn Fn(&str) -> String,
}

impl Validator<'_> {
    /// Problems recorded so far (a section's validator compares before and after).
    pub(super) fn problem_count(&self) -> usize {
        self.problems.len()
    }

    pub(super) fn fail<T>(&mut self, key: &str, message: String) -> Option<T> {
        // Array elements share their array's origin.
        let base = key.split('[').next().unwrap_or(key);
        self.problems.push(Problem {
            key: key.into(),
            origin: (self.origin)(base),
            message,
        });
        None
    }

    fn socket_addr(&mut self, key: &str, value: &str) -> Option<SocketAddr> {
        match super::listen_addr(value) {
            Some(a) => Some(a),
            None => self.fail(
                key,
                format!(
                    "expected an address and port such as `0.0.0.0:8080`, `:8080` (every \
                     interface) or `localhost:8080`, got `{value}`"
                ),
            ),
        }
    }

    pub(super) fn secs(&mut self, key: &str, value: f64) -> Option<Duration> {
        if value.is_finite() && value > 0.0 && value < 1e9 {
            Some(Duration::from_secs_f64(value))
        } else {
            self.fail(
                key,
                format!("must be a positive number of seconds, got {value}"),
            )
        }
    }

    fn upstream(&mut self, key: &str, value: &str) -> Option<UpstreamUrl> {
        if value.is_empty() {
            self.problems.push(Problem {
                key: key.into(),
                origin: super::ORIGIN_NOT_SET.into(),
                message: "required: the MCP server's base URL, e.g. `--upstream \
                          http://mcp-backend:8000` or HOLDFAST_UPSTREAM"
                    .into(),
            });
            return None;
        }
        let uri: Uri = match value.parse() {
            Ok(u) => u,
            Err(e) => return self.fail(key, format!("not a URL ({e}): `{value}`")),
        };
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return self.fail(
                    key,
                    format!("expected an http:// or https:// URL, got `{value}`"),
                )
            }
        };
        let Some(authority) = uri.authority().cloned() else {
            return self.fail(key, format!("the URL has no host: `{value}`"));
        };
        if authority.as_str().contains('@') {
            return self.fail(
                key,
                "credentials in the upstream URL are not supported".into(),
            );
        }
        if let Some(problem) = authority_problem(&authority) {
            return self.fail(key, format!("{problem}: `{value}`"));
        }
        if uri.query().is_some() {
            return self.fail(key, "the upstream URL must not have a query".into());
        }
        if tls {
            // The certificate is verified for this name, and it is sent as SNI.
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']');
            if let Err(e) = rustls::pki_types::ServerName::try_from(host) {
                return self.fail(
                    key,
                    format!("`{host}` cannot be verified as a TLS server name ({e})"),
                );
            }
        }
        Some(UpstreamUrl {
            original: value.into(),
            authority,
            path_prefix: uri.path().trim_end_matches('/').into(),
            tls,
        })
    }

    /// Records a problem with a certificate and key pair under the key of the file at fault:
    /// `cert_key` for the certificate, `key_key` for the private key (which may share one file).
    fn pair_fail<T>(
        &mut self,
        err: TlsError,
        (cert_key, cert_path): (&str, &Path),
        (key_key, key_path): (&str, &Path),
    ) -> Option<T> {
        let at = match &err {
            TlsError::NoCertificate { .. } => cert_key,
            TlsError::NoKey { .. } | TlsError::Key { .. } => key_key,
            _ if err.file() == Some(key_path) && cert_path != key_path => key_key,
            _ => cert_key,
        };
        // Loading stops at the certificate; a missing key file is worth saying in the same
        // round, so a user fixes both at once.
        if at == cert_key && cert_path != key_path {
            if let Err(e) = std::fs::metadata(key_path) {
                self.fail::<()>(key_key, format!("cannot read {}: {e}", key_path.display()));
            }
        }
        self.fail(at, err.to_string())
    }

    /// A path setting; empty counts as unset (so an environment variable can clear a file's).
    fn path(value: &Option<String>) -> Option<PathBuf> {
        value
            .as_deref()
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }

    /// `[tls]`: both files or neither; the files must load.
    fn inbound_tls(&mut self, raw: &RawTls) -> Option<InboundTls> {
        let reload_interval = self.secs("tls.reload_interval_secs", raw.reload_interval_secs);
        let client_ca = Self::path(&raw.client_ca);
        let (cert, key) = match (Self::path(&raw.cert), Self::path(&raw.key)) {
            (Some(cert), Some(key)) => (cert, key),
            (None, None) => {
                if client_ca.is_some() {
                    self.fail::<()>(
                        "tls.client_ca",
                        "client certificates need TLS: set tls.cert and tls.key too".into(),
                    );
                }
                return None;
            }
            (Some(_), None) => {
                return self.fail(
                    "tls.key",
                    "tls.cert is set, so the key is needed too".into(),
                )
            }
            (None, Some(_)) => {
                return self.fail(
                    "tls.cert",
                    "tls.key is set, so the certificate is needed too".into(),
                )
            }
        };
        let identity = match Identity::load(&cert, &key) {
            Ok(identity) => Some(identity),
            Err(e) => self.pair_fail(e, ("tls.cert", &cert), ("tls.key", &key)),
        };
        let client_verifier = match &client_ca {
            Some(ca) => match tls::client_verifier(ca) {
                Ok(verifier) => Some(Some(verifier)),
                Err(e) => self.fail("tls.client_ca", e.to_string()),
            },
            None => Some(None),
        };
        Some(InboundTls {
            cert,
            key,
            client_ca,
            reload_interval: reload_interval?,
            session_resumption: raw.session_resumption,
            identity: identity?,
            client_verifier: client_verifier?,
        })
    }

    /// The `client.*` TLS keys: only for an `https://` upstream, whose trust (system roots, a
    /// CA bundle, or none) and optional client certificate they set.
    fn upstream_tls(
        &mut self,
        raw: &RawClient,
        upstream: &UpstreamUrl,
        host_header: Option<HostHeader>,
        store_tls: bool,
    ) -> Option<UpstreamTls> {
        let (ca, cert, key) = (
            Self::path(&raw.ca),
            Self::path(&raw.cert),
            Self::path(&raw.key),
        );
        if !upstream.tls {
            // A TLS setting for a plain upstream (and no store over TLS) means the URL or the
            // setting is a mistake.
            for (k, set) in [
                ("client.ca", ca.is_some() && !store_tls),
                ("client.cert", cert.is_some() && !store_tls),
                ("client.key", key.is_some() && !store_tls),
                ("client.insecure_skip_verify", raw.insecure_skip_verify),
            ] {
                if set {
                    self.fail::<()>(
                        k,
                        "applies only to an https:// upstream or a rediss:// sessions.store, and \
                         the upstream is http://"
                            .into(),
                    );
                }
            }
            return None;
        }
        let trust = match (&ca, raw.insecure_skip_verify) {
            (Some(_), true) => self.fail(
                "client.insecure_skip_verify",
                "contradicts client.ca: either verify against the CA bundle or not at all".into(),
            ),
            (Some(ca), false) => match tls::load_roots(ca) {
                Ok(roots) => Some((tls::Trust::Roots(roots), UpstreamVerify::Ca(ca.clone()))),
                Err(e) => self.fail("client.ca", e.to_string()),
            },
            (None, true) => Some((
                tls::Trust::InsecureSkipVerify,
                UpstreamVerify::InsecureSkipVerify,
            )),
            (None, false) => match tls::system_roots() {
                Ok(roots) => Some((tls::Trust::Roots(roots), UpstreamVerify::SystemRoots)),
                Err(e) => self.fail("client.ca", e.to_string()),
            },
        };
        let identity = match (&cert, &key) {
            (Some(cert), Some(key)) => match Identity::load(cert, key) {
                Ok(identity) => Some(Some(identity.certified_key())),
                Err(e) => self.pair_fail(e, ("client.cert", cert), ("client.key", key)),
            },
            (None, None) => Some(None),
            (Some(_), None) => self.fail(
                "client.key",
                "client.cert is set, so its key is needed too".into(),
            ),
            (None, Some(_)) => self.fail(
                "client.cert",
                "client.key is set, so the certificate is needed too".into(),
            ),
        };
        let (trust, verify) = trust?;
        // HTTP/2 carries the host in `:authority`, which hyper's pooled client takes from the
        // URI it connects to: the upstream's authority. A preserved client Host would have to
        // travel as a `Host` header that differs from `:authority`, which RFC 9113 §8.3.1
        // forbids (and servers resolve either way). So h2 is offered only when the upstream is
        // to see its own authority anyway; otherwise the connection stays HTTP/1.1, where Host
        // is preserved exactly.
        let offers_h2 = host_header == Some(HostHeader::Upstream);
        Some(UpstreamTls {
            config: tls::client_config(trust, identity?, offers_h2),
            verify,
            client_cert: cert,
            offers_h2,
        })
    }
}

/// Names where `key`'s value came from in the terms a user knows.
pub(super) fn describe_origin(key: &str, md: Option<&figment::Metadata>) -> String {
    let Some(md) = md else {
        return ORIGIN_DEFAULT.into();
    };
    match &md.source {
        Some(figment::Source::File(p)) => format!("file {}", p.display()),
        _ if md.name.contains("environment") && !key.is_empty() => format!(
            "environment variable {ENV_PREFIX}{}",
            key.to_ascii_uppercase().replace('.', "__")
        ),
        _ if md.name.contains("environment") => "environment".into(),
        _ => md.name.to_string(),
    }
}

/// Removes the value at `path` from `data` (or the array that contains it). Returns whether
/// something was removed.
fn remove_path(data: &mut figment::value::Dict, path: &[String]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return false;
    };
    if rest.is_empty() {
        return data.remove(first).is_some();
    }
    match data.get_mut(first) {
        Some(figment::value::Value::Dict(_, inner)) => remove_path(inner, rest),
        // Inside an array (or a scalar): drop the whole value.
        Some(_) => data.remove(first).is_some(),
        None => false,
    }
}

/// What is wrong with an upstream URL's `host[:port]`, if anything: an empty host, or a port
/// that is not a number from 1 to 65535 (`http::Uri` accepts `:99999` and `:0`).
fn authority_problem(authority: &http::uri::Authority) -> Option<&'static str> {
    if authority.host().is_empty() {
        return Some("the URL has no host");
    }
    let text = authority.as_str();
    let port = match text.rfind(']') {
        // An IPv6 literal: a port only after the bracket.
        Some(end) => text[end + 1..].strip_prefix(':'),
        None => text.rsplit_once(':').map(|(_, p)| p),
    };
    match port {
        None => None,
        Some("") => Some("the URL's port is empty"),
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => Some("the URL's port must be a number from 1 to 65535"),
            Ok(_) => None,
        },
    }
}
/// The sections of the top level and the small ones, each checked on its own.
impl Validator<'_> {
    /// `log_format` and `log_level`.
    fn logging(&mut self, raw: &RawConfig) -> (Option<LogFormat>, Option<String>) {
        let format = match raw.log_format.as_str() {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            other => self.fail(
                "log_format",
                format!("expected `text` or `json`, got `{other}`"),
            ),
        };
        let level = match super::log_level::check(&raw.log_level) {
            Ok(()) => Some(raw.log_level.clone()),
            Err(message) => self.fail("log_level", message),
        };
        (format, level)
    }

    /// `client.host_header`.
    fn host_header(&mut self, value: &str) -> Option<HostHeader> {
        match value {
            "preserve" => Some(HostHeader::Preserve),
            "upstream" => Some(HostHeader::Upstream),
            other => self.fail(
                "client.host_header",
                format!("expected `preserve` or `upstream`, got `{other}`"),
            ),
        }
    }

    /// `[limits]`: the head's read timeout and the HTTP/2 ping interval; the sizes and counts
    /// are used as they are, once checked.
    fn limits(&mut self, limits: &RawLimits) -> (Option<Duration>, Option<Duration>) {
        let header_read_timeout = self.secs(
            "limits.header_read_timeout_secs",
            limits.header_read_timeout_secs,
        );
        let h2_ping_interval =
            self.secs("limits.h2_ping_interval_secs", limits.h2_ping_interval_secs);
        // Below 8 KiB ordinary requests stop fitting: a session token alone is up to 3 KiB
        // (session::token::MAX_TOKEN_LEN), beside a bearer token and the usual headers.
        if limits.max_header_bytes < 8192 {
            self.fail::<()>("limits.max_header_bytes", "must be at least 8192".into());
        }
        if !(1..=10_000).contains(&limits.max_headers) {
            self.fail::<()>("limits.max_headers", "must be between 1 and 10000".into());
        }
        if limits.max_connections == 0 {
            self.fail::<()>("limits.max_connections", "must be at least 1".into());
        }
        (header_read_timeout, h2_ping_interval)
    }

    /// `[shutdown]`: the drain's length, and how long accepting goes on (0: not at all).
    fn shutdown(&mut self, shutdown: &RawShutdown) -> (Option<Duration>, Option<Duration>) {
        let drain = self.secs("shutdown.drain_timeout_secs", shutdown.drain_timeout_secs);
        let grace = shutdown.accept_grace_secs;
        let accept_grace = if grace == 0.0 {
            Some(Duration::ZERO)
        } else {
            self.secs("shutdown.accept_grace_secs", grace)
        };
        (drain, accept_grace)
    }
}
