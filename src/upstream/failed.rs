//! What a failed send means for the request: decided here, where it failed, so the classifier
//! matches a small enum instead of walking error types.

use std::error::Error as StdError;
use std::io;

use super::{ConnectError, ConnectErrorKind, NeverRead, SendError};
use crate::errors::{find_cause, ErrorChain};
use crate::replay::ClientBodyError;

/// How sending a request failed, and so whether it may have reached the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedSend {
    /// No connection was made (refused, timed out, no name, unreachable, a TLS handshake
    /// refused): nothing was sent.
    NotConnected(ConnectErrorKind),
    /// The connection closed before the upstream read a byte of the request, as the kernel
    /// shows: nothing reached the application.
    NeverRead,
    /// The client's request body failed while it was being forwarded: the client's fault, not
    /// the upstream's (the upstream got an upload cut short, which no application runs).
    ClientBody(ClientBodyFault),
    /// TLS failed after the handshake (with TLS 1.3 an upstream that refuses holdfast's client
    /// certificate says so only after the request was written).
    Tls,
    /// The upstream answered with something that is not HTTP.
    Protocol,
    /// The connection broke (closed, reset, incomplete) after the request was, perhaps partly,
    /// written.
    Broke,
}

/// How a client's request body failed while it was forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientBodyFault {
    /// It did not decode (a bad chunk, a chunk size past 16 hex digits, a bad trailer) or ended
    /// before its length: nginx's and HAProxy's 400.
    Malformed,
    /// The client sent nothing for `streams.idle_timeout_secs`: nginx's 408.
    Stalled,
}

impl ClientBodyFault {
    fn of(err: &ClientBodyError) -> ClientBodyFault {
        match err {
            ClientBodyError::Idle(_) => ClientBodyFault::Stalled,
            // `Failed` repeats an earlier attempt's failure, and `Superseded` ends an attempt
            // that nobody answers from: neither was a stall of this one.
            ClientBodyError::Read(_) | ClientBodyError::Failed | ClientBodyError::Superseded => {
                ClientBodyFault::Malformed
            }
        }
    }
}

impl FailedSend {
    /// Whether any of the request may have reached the application: then it is never sent
    /// again.
    pub fn sent(self) -> bool {
        !matches!(self, FailedSend::NotConnected(_) | FailedSend::NeverRead)
    }

    /// Reads an error chain, cause by cause in a fixed order (the first that matches wins): a
    /// failed connection or a proven-unread request anywhere in it means nothing was sent,
    /// however it was wrapped (hyper-util wraps its connector's errors); anything unknown may
    /// have been sent.
    pub fn of(err: &(dyn StdError + 'static)) -> FailedSend {
        if let Some(connect) = find_cause::<ConnectError>(err) {
            FailedSend::NotConnected(connect.kind())
        } else if find_cause::<NeverRead>(err).is_some() {
            FailedSend::NeverRead
        } else if let Some(body) = find_cause::<ClientBodyError>(err) {
            FailedSend::ClientBody(ClientBodyFault::of(body))
        } else if find_cause::<rustls::Error>(err).is_some() {
            FailedSend::Tls
        } else if let Some(h) = find_cause::<crate::http1::Error>(err) {
            if h.is_parse() {
                FailedSend::Protocol
            } else {
                FailedSend::Broke
            }
        } else if let Some(h) = find_cause::<hyper::Error>(err) {
            if h.is_parse() || h.is_parse_status() {
                FailedSend::Protocol
            } else {
                // Closed, reset, incomplete message, canceled.
                FailedSend::Broke
            }
        } else if find_cause::<io::Error>(err).is_some() {
            FailedSend::Broke
        } else {
            // Still "may have been sent" (never assume otherwise), but say so loudly.
            tracing::warn!(error = %ErrorChain(err), "unexpected upstream error; answering 502");
            FailedSend::Broke
        }
    }
}

impl SendError {
    /// What this failure means for the request.
    pub fn failed(&self) -> FailedSend {
        match self {
            SendError::Connect(connect) => FailedSend::NotConnected(connect.kind()),
            SendError::NeverRead(_) => FailedSend::NeverRead,
            SendError::Exchange(_) | SendError::Pooled(_) => FailedSend::of(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug)]
    struct Layer(Box<dyn StdError + Send + Sync>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("layer")
        }
    }

    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    fn io_kind() -> impl Strategy<Value = io::ErrorKind> {
        prop::sample::select(vec![
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::ConnectionAborted,
            io::ErrorKind::NotConnected,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::TimedOut,
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::WouldBlock,
            io::ErrorKind::Interrupted,
            io::ErrorKind::Other,
        ])
    }

    #[test]
    fn a_failed_connection_is_found_however_it_was_wrapped() {
        for kind in [
            ConnectErrorKind::Refused,
            ConnectErrorKind::Timeout,
            ConnectErrorKind::Dns,
            ConnectErrorKind::Unreachable,
            ConnectErrorKind::Other,
            ConnectErrorKind::Tls,
        ] {
            // Wrapped, as hyper-util wraps it.
            let outer = io::Error::other(ConnectError::new(kind, io::Error::other("x")));
            let failed = FailedSend::of(&outer);
            assert_eq!(failed, FailedSend::NotConnected(kind));
            assert!(!failed.sent());
            let direct = SendError::Connect(ConnectError::new(kind, io::Error::other("x")));
            assert_eq!(direct.failed(), failed);
        }
    }

    #[test]
    fn tls_after_the_handshake_and_a_failed_client_body_are_told_apart() {
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let after_send = io::Error::other(io::Error::new(io::ErrorKind::InvalidData, alert));
        assert_eq!(FailedSend::of(&after_send), FailedSend::Tls);
        let body = crate::http1::Error::Body(Box::new(ClientBodyError::Failed));
        assert_eq!(
            SendError::Exchange(body).failed(),
            FailedSend::ClientBody(ClientBodyFault::Malformed)
        );
        let idle = ClientBodyError::Idle(std::time::Duration::from_secs(1));
        let stalled = SendError::Exchange(crate::http1::Error::Body(Box::new(idle)));
        assert_eq!(
            stalled.failed(),
            FailedSend::ClientBody(ClientBodyFault::Stalled)
        );
        let parse = SendError::Exchange(crate::http1::Error::Parse("status"));
        assert_eq!(parse.failed(), FailedSend::Protocol);
        assert!(parse.failed().sent());
        let eof = SendError::Exchange(crate::http1::Error::Incomplete);
        assert_eq!(eof.failed(), FailedSend::Broke);
    }

    proptest! {
        /// A failed exchange that is not a failed connection (no `ConnectError`, no
        /// `NeverRead` in its chain) may have reached the application: never held for a
        /// replay, whatever I/O error it carries and however deep.
        #[test]
        fn an_exchange_error_may_always_have_been_sent(kind in io_kind(), depth in 0usize..4) {
            let mut err: Box<dyn StdError + Send + Sync> = Box::new(io::Error::from(kind));
            for _ in 0..depth {
                err = Box::new(Layer(err));
            }
            let failed = FailedSend::of(&*err);
            prop_assert!(failed.sent(), "{kind:?} at depth {depth}: {failed:?}");
        }
    }
}
