//! TLS with rustls and its ring provider: the proxy listener's certificate (reloaded when its
//! files change), optional client authentication, and the client side of an `https://` upstream.
//!
//! **Inbound.** A [`CertStore`] hands the current certificate to every new handshake. A task
//! ([`spawn_reloader`]) reads the certificate and key files every `tls.reload_interval_secs` and,
//! when their *contents* changed, loads them and swaps the new certificate in. Open connections
//! keep the session they negotiated, so a rotation drops no connection and no stream. Contents
//! are compared rather than watched: Kubernetes updates a mounted Secret by swapping a symlink
//! (`..data`), which inotify on the file itself misses, and certbot renews by replacing files;
//! reading two small files every few seconds sees both. A new file that does not load (half
//! written, key not matching the certificate) keeps the old certificate and logs one error; the
//! next change is tried again.
//!
//! **Outbound.** [`client_config`] builds what the upstream connector uses: verification against
//! the system roots or a CA bundle (`client.ca`), or none at all with the loudly named
//! `client.insecure_skip_verify`; an optional client certificate; ALPN (in `upstream.rs`).
//! A certificate's expiry is read from its DER in `expiry.rs`.
//!
//! Every configuration is built with [`provider`] (ring) explicitly; nothing relies on a
//! process-wide default provider.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio::task::JoinHandle;

use crate::metrics::{HandshakeFailure, TlsMetrics};

mod expiry;
mod upstream;

pub use expiry::not_after;
use expiry::utc;
pub use upstream::{client_config, Trust};

/// ALPN protocols the listener offers, preferred first. A client that offers neither (or no
/// ALPN at all) gets HTTP/1.1, or HTTP/2 if it starts with the HTTP/2 preface.
pub const SERVER_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The crypto provider of every TLS configuration holdfast builds: ring.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// A TLS file that cannot be used, naming the file and why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is not valid PEM.
    #[error("{} is not valid PEM: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// No `CERTIFICATE` block.
    #[error("{} holds no certificate (a PEM `CERTIFICATE` block)", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// No private key block.
    #[error(
        "{} holds no private key (a PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block)",
        path.display()
    )]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// The key is of an unsupported kind, or does not belong to the certificate.
    #[error("the private key in {} cannot be used with the certificate in {}: {source}", key.display(), cert.display())]
    Key {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason (`InconsistentKeys(KeyMismatch)` for a key of another certificate).
        #[source]
        source: rustls::Error,
    },
    /// A CA bundle that cannot serve as trust anchors.
    #[error("the CA bundle {} cannot be used: {source}", path.display())]
    Ca {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The system has no usable root certificates.
    #[error("no system root certificates were found ({detail}); set client.ca to a CA bundle")]
    NoSystemRoots {
        /// What the loader reported.
        detail: String,
    },
}

impl TlsError {
    /// The file at fault (for a key that does not fit its certificate: the key file).
    pub fn file(&self) -> Option<&Path> {
        match self {
            TlsError::Read { path, .. }
            | TlsError::Pem { path, .. }
            | TlsError::NoCertificate { path }
            | TlsError::NoKey { path }
            | TlsError::Ca { path, .. } => Some(path),
            TlsError::Key { key, .. } => Some(key),
            TlsError::NoSystemRoots { .. } => None,
        }
    }
}

/// Reads a whole file.
pub fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.into(),
        source,
    })
}

/// Every certificate in a PEM file, in order (leaf first for a chain).
pub fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.into(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn parse_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey { path: path.into() },
        source => TlsError::Pem {
            path: path.into(),
            source,
        },
    })
}

/// A certificate chain and its key as one signing identity, checked to belong together.
pub fn certified_key(
    cert_path: &Path,
    chain: Vec<CertificateDer<'static>>,
    key_path: &Path,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, TlsError> {
    CertifiedKey::from_der(chain, key, &provider())
        .map(Arc::new)
        .map_err(|source| TlsError::Key {
            cert: cert_path.into(),
            key: key_path.into(),
            source,
        })
}

/// Trust anchors from a PEM CA bundle.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certs(path, &read(path)?)? {
        roots.add(cert).map_err(|e| TlsError::Ca {
            path: path.into(),
            source: Box::new(e),
        })?;
    }
    Ok(roots)
}

/// The operating system's trust anchors (`/etc/ssl/certs` and friends; `SSL_CERT_FILE` and
/// `SSL_CERT_DIR` override). An error only when none could be loaded at all.
pub fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let detail = if found.errors.is_empty() {
            "the system trust store is empty".to_string()
        } else {
            found
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        return Err(TlsError::NoSystemRoots { detail });
    }
    Ok(roots)
}

// --- Inbound ---------------------------------------------------------------------------------

/// A certificate chain and its private key as loaded from PEM files (the listener's certificate,
/// or the client certificate for the upstream), with the file contents they came from (what the
/// reloader compares against).
#[derive(Clone)]
pub struct Identity {
    key: Arc<CertifiedKey>,
    not_after: Option<i64>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl Identity {
    /// Reads and checks the certificate chain and key files.
    pub fn load(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
        Identity::from_pem(cert, read(cert)?, key, read(key)?)
    }

    fn from_pem(
        cert_path: &Path,
        cert_pem: Vec<u8>,
        key_path: &Path,
        key_pem: Vec<u8>,
    ) -> Result<Identity, TlsError> {
        let chain = parse_certs(cert_path, &cert_pem)?;
        let not_after = not_after(&chain[0]);
        let key = parse_key(key_path, &key_pem)?;
        Ok(Identity {
            key: certified_key(cert_path, chain, key_path, key)?,
            not_after,
            cert_pem,
            key_pem,
        })
    }

    /// The leaf certificate's notAfter as Unix time (`None` if it could not be read).
    pub fn not_after(&self) -> Option<i64> {
        self.not_after
    }

    /// The chain and key as rustls uses them.
    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        self.key.clone()
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("chain_len", &self.key.cert.len())
            .field("not_after", &self.not_after.map(utc))
            .finish_non_exhaustive()
    }
}

/// Hands the current certificate to every new handshake; swapped by the reloader.
#[derive(Debug)]
pub struct CertStore {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    /// A store serving `cert`.
    pub fn new(cert: &Identity) -> Arc<CertStore> {
        Arc::new(CertStore {
            current: RwLock::new(cert.key.clone()),
        })
    }

    fn set(&self, cert: &Identity) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = cert.key.clone();
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// Verifies client certificates against a CA bundle (`tls.client_ca`); clients without one are
/// refused.
pub fn client_verifier(ca: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(ca)?), provider())
        .build()
        .map_err(|e| TlsError::Ca {
            path: ca.into(),
            source: Box::new(e),
        })
}

/// The listener's configuration: TLS 1.2 and 1.3, the certificate from `store`, client
/// certificates checked by `verifier` when set, ALPN `h2` and `http/1.1`.
///
/// With `resumption` (`tls.session_resumption`, the default), rustls's own: a returning client
/// resumes from an in-memory cache of 256 sessions (TLS 1.2 session ids; TLS 1.3 tickets that
/// name a cached session, two per handshake). Without, every handshake is a full one: nothing is
/// cached and no ticket is sent.
pub fn server_config(
    store: Arc<CertStore>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    resumption: bool,
) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports TLS 1.2 and 1.3");
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(store);
    config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    if !resumption {
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    Arc::new(config)
}

/// Where the reloader looks, and how often.
#[derive(Debug, Clone)]
pub struct Reload {
    /// Certificate chain file.
    pub cert: PathBuf,
    /// Key file.
    pub key: PathBuf,
    /// Poll interval.
    pub interval: Duration,
}

/// Polls the certificate files and swaps a changed, valid certificate into `store`, starting
/// from `current` (what the store serves now). Sets the expiry gauge now and on every reload.
pub fn spawn_reloader(
    store: Arc<CertStore>,
    current: Identity,
    reload: Reload,
    metrics: TlsMetrics,
) -> JoinHandle<()> {
    set_expiry(&metrics, &current);
    tokio::spawn(async move {
        // The contents last tried, loaded or not: unchanged files are not parsed again, and a bad
        // file is reported once, not on every poll.
        let mut tried = (current.cert_pem.clone(), current.key_pem.clone());
        let mut last_read_error: Option<String> = None;
        let mut ticks = tokio::time::interval(reload.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await; // The first tick is immediate; the files were just loaded.
        loop {
            ticks.tick().await;
            let files = match (
                tokio::fs::read(&reload.cert).await,
                tokio::fs::read(&reload.key).await,
            ) {
                (Ok(cert), Ok(key)) => (cert, key),
                (Err(e), _) | (_, Err(e)) => {
                    let message = e.to_string();
                    if last_read_error.as_deref() != Some(message.as_str()) {
                        tracing::error!(
                            cert = %reload.cert.display(),
                            key = %reload.key.display(),
                            error = %message,
                            "cannot read the TLS certificate files; still serving the previous certificate"
                        );
                        last_read_error = Some(message);
                    }
                    continue;
                }
            };
            last_read_error = None;
            if files == tried {
                continue;
            }
            tried = files.clone();
            match Identity::from_pem(&reload.cert, files.0, &reload.key, files.1) {
                Ok(new) => {
                    store.set(&new);
                    set_expiry(&metrics, &new);
                    tracing::info!(
                        cert = %reload.cert.display(),
                        not_after = new.not_after.map(utc).as_deref().unwrap_or("unknown"),
                        "TLS certificate reloaded; new connections get it, open ones keep theirs"
                    );
                }
                Err(e) => tracing::error!(
                    error = %e,
                    "the changed TLS certificate files do not load; still serving the previous certificate"
                ),
            }
        }
    })
}

fn set_expiry(metrics: &TlsMetrics, cert: &Identity) {
    match cert.not_after {
        Some(t) => {
            metrics.cert_expiry.set(t);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            if t < now {
                tracing::warn!(not_after = %utc(t), "the serving TLS certificate has expired");
            }
        }
        None => tracing::warn!(
            "cannot read the serving certificate's expiry; holdfast_tls_cert_expiry_timestamp_seconds is not updated"
        ),
    }
}

/// Why an inbound handshake failed, as a bounded metric label.
pub fn handshake_failure(err: &io::Error) -> HandshakeFailure {
    use rustls::{AlertDescription as A, Error as E};
    match err.get_ref().and_then(|e| e.downcast_ref::<E>()) {
        Some(E::NoCertificatesPresented) => HandshakeFailure::no_certificate,
        Some(E::InvalidCertificate(_)) => HandshakeFailure::bad_certificate,
        Some(E::AlertReceived(
            A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::AccessDenied,
        )) => HandshakeFailure::rejected_by_client,
        Some(
            E::InvalidMessage(_)
            | E::InappropriateMessage { .. }
            | E::InappropriateHandshakeMessage { .. }
            | E::PeerIncompatible(_)
            | E::PeerMisbehaved(_)
            | E::AlertReceived(_)
            | E::NoApplicationProtocol
            | E::PeerSentOversizedRecord
            | E::DecryptError,
        ) => HandshakeFailure::protocol,
        Some(_) => HandshakeFailure::other,
        None => match err.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => HandshakeFailure::closed,
            _ => HandshakeFailure::other,
        },
    }
}

#[cfg(test)]
mod tests;
