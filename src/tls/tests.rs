//! The listener's TLS: handshake failures, identities, and the reloader.

use super::*;

/// A key and a self-signed certificate for `localhost`.
fn self_signed() -> (rcgen::KeyPair, rcgen::Certificate) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (key, cert)
}

#[test]
fn handshake_failures_have_bounded_reasons() {
    let tls = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
    for (err, want) in [
        (
            tls(rustls::Error::NoCertificatesPresented),
            HandshakeFailure::no_certificate,
        ),
        (
            tls(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
            HandshakeFailure::bad_certificate,
        ),
        (
            tls(rustls::Error::AlertReceived(
                rustls::AlertDescription::UnknownCA,
            )),
            HandshakeFailure::rejected_by_client,
        ),
        (
            tls(rustls::Error::AlertReceived(
                rustls::AlertDescription::ProtocolVersion,
            )),
            HandshakeFailure::protocol,
        ),
        (
            tls(rustls::Error::NoApplicationProtocol),
            HandshakeFailure::protocol,
        ),
        (
            io::Error::from(io::ErrorKind::UnexpectedEof),
            HandshakeFailure::closed,
        ),
        (
            io::Error::from(io::ErrorKind::ConnectionReset),
            HandshakeFailure::closed,
        ),
        (io::Error::other("strange"), HandshakeFailure::other),
    ] {
        assert_eq!(handshake_failure(&err), want, "{err}");
    }
}

#[test]
fn a_key_of_another_certificate_is_refused() {
    let (a, cert) = self_signed();
    let b = rcgen::KeyPair::generate().unwrap();
    let err = Identity::from_pem(
        Path::new("c.pem"),
        cert.pem().into_bytes(),
        Path::new("k.pem"),
        b.serialize_pem().into_bytes(),
    )
    .unwrap_err();
    assert!(matches!(err, TlsError::Key { .. }), "{err}");
    let ok = Identity::from_pem(
        Path::new("c.pem"),
        cert.pem().into_bytes(),
        Path::new("k.pem"),
        a.serialize_pem().into_bytes(),
    )
    .expect("the matching key loads");
    assert_eq!(
        ok.certified_key().cert.first().map(|c| c.as_ref()),
        Some(cert.der().as_ref()),
        "the identity serves the certificate it was given"
    );
    let err = Identity::from_pem(
        Path::new("c.pem"),
        b"nothing here".to_vec(),
        Path::new("k.pem"),
        a.serialize_pem().into_bytes(),
    )
    .unwrap_err();
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
    let err = Identity::from_pem(
        Path::new("c.pem"),
        cert.pem().into_bytes(),
        Path::new("k.pem"),
        cert.pem().into_bytes(),
    )
    .unwrap_err();
    assert!(matches!(err, TlsError::NoKey { .. }), "{err}");
}

/// Log lines, as the binary would print them, collected for a test.
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn count(&self, needle: &str) -> usize {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().filter(|l| l.contains(needle)).count()
    }
}

/// A changed file that does not load is said once, however often the reloader looks at it
/// again, and the reloader goes on looking: the good key back, it loads. On a paused clock
/// every interval is one look (file reads run on blocking threads, which hold the clock).
#[tokio::test(start_paused = true)]
async fn a_file_that_does_not_load_is_said_once_and_the_reloader_goes_on() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = std::env::temp_dir().join(format!("holdfast-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    let (key, cert) = self_signed();
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let current = Identity::load(&cert_path, &key_path).unwrap();
    let store = CertStore::new(&current);
    let interval = Duration::from_millis(50);
    let reloader = spawn_reloader(
        store,
        current,
        Reload {
            cert: cert_path.clone(),
            key: key_path.clone(),
            interval,
        },
        TlsMetrics::default(),
    );

    let other = rcgen::KeyPair::generate().unwrap();
    std::fs::write(&key_path, other.serialize_pem()).unwrap();
    tokio::time::sleep(interval * 20).await;
    assert_eq!(lines.count("do not load"), 1, "said once in twenty looks");
    assert_eq!(lines.count("ERROR"), 1);

    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    tokio::time::sleep(interval * 2).await;
    assert_eq!(lines.count("TLS certificate reloaded"), 1);
    assert_eq!(lines.count("do not load"), 1);
    reloader.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Kinds of the handshakes of `n` connections, one after another, of one client (its own
/// session cache) to a listener configured with `resumption`.
async fn handshakes(resumption: bool, n: usize) -> Vec<rustls::HandshakeKind> {
    let (key, cert) = self_signed();
    let identity = Identity::from_pem(
        Path::new("c.pem"),
        cert.pem().into_bytes(),
        Path::new("k.pem"),
        key.serialize_pem().into_bytes(),
    )
    .unwrap();
    let acceptor =
        tokio_rustls::TlsAcceptor::from(server_config(CertStore::new(&identity), None, resumption));
    let mut roots = RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let mut kinds = Vec::new();
    for _ in 0..n {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, b) = tokio::io::duplex(64 * 1024);
        let server = {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let mut tls = acceptor.accept(b).await.unwrap();
                // TLS 1.3 tickets follow the handshake: the client reads them with this byte.
                tls.write_all(b"x").await.unwrap();
                tls.flush().await.unwrap();
                tls.shutdown().await.unwrap();
            })
        };
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, a).await.unwrap();
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.unwrap();
        kinds.push(tls.get_ref().1.handshake_kind().unwrap());
        server.await.unwrap();
    }
    kinds
}

/// `tls.session_resumption`: on (the default), a returning client resumes; off, every
/// handshake is a full one (what a like-for-like benchmark of full handshakes needs).
#[tokio::test]
async fn a_returning_client_resumes_only_with_session_resumption_on() {
    use rustls::HandshakeKind::{Full, Resumed};
    assert_eq!(handshakes(true, 3).await, [Full, Resumed, Resumed]);
    assert_eq!(handshakes(false, 3).await, [Full, Full, Full]);
}
