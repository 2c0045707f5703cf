//! The client side of an `https://` upstream: how its certificate is checked, an optional client
//! certificate, ALPN.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::provider;

/// How the upstream's certificate is checked.
pub enum Trust {
    /// Against these anchors (the system's, or `client.ca`), for the upstream URL's host.
    Roots(RootCertStore),
    /// Not at all (`client.insecure_skip_verify`). The handshake's signatures are still checked,
    /// so the peer holds the key of the certificate it sent; but anyone can send any certificate.
    InsecureSkipVerify,
}

/// The upstream connector's configuration: TLS 1.2 and 1.3, `trust`, an optional client
/// certificate, and ALPN `h2` (when `offer_h2`) and `http/1.1`.
pub fn client_config(
    trust: Trust,
    identity: Option<Arc<CertifiedKey>>,
    offer_h2: bool,
) -> Arc<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports TLS 1.2 and 1.3");
    let builder = match trust {
        Trust::Roots(roots) => builder.with_root_certificates(roots),
        Trust::InsecureSkipVerify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipVerification(provider()))),
    };
    let mut config = match identity {
        Some(identity) => builder.with_client_cert_resolver(Arc::new(ClientIdentity(identity))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = if offer_h2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Arc::new(config)
}

/// The client certificate sent to an upstream that asks for one.
#[derive(Debug)]
struct ClientIdentity(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for ClientIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Accepts any server certificate (`client.insecure_skip_verify`), still checking that the
/// server signed the handshake with the key of the certificate it sent.
#[derive(Debug)]
struct SkipVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for SkipVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
