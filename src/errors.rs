//! Reading error chains: finding a cause of one type, and showing the whole chain.

use std::error::Error as StdError;
use std::io;

/// A boxed error of any cause: what bodies fail with, through the proxy and our own HTTP/1
/// (`Send + Sync`, so it crosses tasks).
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// Walks an error's source chain for a cause of type `E`.
pub fn find_cause<'a, E: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut cur: Option<&'a (dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        // `io::Error::source` skips the error it wraps (it returns the wrapped error's source),
        // so step into the wrapped error explicitly.
        cur = match e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

/// Displays an error with all its causes (`a: b: c`), for logs.
pub struct ErrorChain<'a>(pub &'a (dyn StdError + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(e) = cur {
            write!(f, ": {e}")?;
            cur = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] io::Error);

    #[test]
    fn a_cause_inside_an_io_error_is_found_and_shown() {
        let inner = io::Error::other(std::fmt::Error);
        let err = Outer(inner);
        assert!(find_cause::<std::fmt::Error>(&err).is_some());
        assert!(find_cause::<std::str::Utf8Error>(&err).is_none());
        assert_eq!(
            ErrorChain(&err).to_string(),
            "outer: an error occurred when formatting an argument"
        );
    }
}
