//! Validating `[pause]` and the admin token: a pause that ends, and a token worth the name.

use std::path::Path;
use std::time::Duration;

use super::validate::Validator;
use super::RawPause;

/// Fewest characters of an admin token: anything shorter is guessable over a network.
const MIN_TOKEN_LEN: usize = 16;

/// Validated `[pause]`.
#[derive(Debug, Clone)]
pub struct Pause {
    /// Longest a pause lasts before holdfast resumes by itself.
    pub max: Duration,
}

/// The bearer token of the admin endpoints that change state. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// Reads the token from `path`: the file's content without surrounding whitespace (a
    /// trailing newline is what `echo` and most secret stores leave).
    pub fn read(path: &Path) -> Result<AdminToken, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let token = text.trim();
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "the token in {} has {} characters; at least {MIN_TOKEN_LEN} are needed",
                path.display(),
                token.len()
            ));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "the token in {} must be one line without spaces",
                path.display()
            ));
        }
        Ok(AdminToken(token.to_owned()))
    }

    /// A token from a string, for tests elsewhere in the crate.
    #[cfg(test)]
    pub(crate) fn for_tests(token: &str) -> AdminToken {
        AdminToken(token.to_owned())
    }

    /// The token, to send it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is the token, compared in time independent of where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let want = self.0.as_bytes();
        let mut diff = u8::from(want.len() != presented.len());
        for (i, w) in want.iter().enumerate() {
            diff |= w ^ presented.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl Validator<'_> {
    /// Checks `[pause]`; `None` when a problem was recorded.
    pub(super) fn pause(&mut self, raw: &RawPause) -> Option<Pause> {
        let max = self.secs("pause.max_secs", raw.max_secs)?;
        Some(Pause { max })
    }

    /// Reads `admin_token_file`, if set. `Some(None)`: no token; `None`: a problem was recorded.
    pub(super) fn admin_token(&mut self, file: Option<&str>) -> Option<Option<AdminToken>> {
        let Some(file) = file else {
            return Some(None);
        };
        match AdminToken::read(Path::new(file)) {
            Ok(token) => Some(Some(token)),
            Err(e) => self.fail("admin_token_file", e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_compares_whole() {
        let t = AdminToken("0123456789abcdef".into());
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b"0123456789abcdefg"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "AdminToken(..)");
    }
}
