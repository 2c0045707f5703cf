//! What a configuration error says, in the words of the file, not of the Rust types behind it:
//! "expected a whole number, got \"many\"" rather than "invalid type: found string, expected
//! usize", and the nearest key for one that does not exist.

use figment::error::{Actual, Kind};

/// The message for one deserialization error.
pub(super) fn describe(kind: &Kind) -> String {
    match kind {
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!(
                "expected {}, got {}",
                expected_in_words(expected),
                got(actual)
            )
        }
        Kind::UnknownField(found, known) => unknown("key", found, known),
        Kind::UnknownVariant(found, known) => unknown("value", found, known),
        Kind::MissingField(name) => format!("missing key `{name}`"),
        Kind::DuplicateField(name) => format!("`{name}` is set twice"),
        other => other.to_string().replace('`', ""),
    }
}

/// serde's name of what it expected, as a person would say it.
fn expected_in_words(expected: &str) -> String {
    let plain = expected.trim_start_matches("a ").trim_start_matches("an ");
    match plain {
        "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number (0 or more)".into(),
        "isize" | "i64" | "i32" | "i16" | "i8" => "a whole number".into(),
        "f64" | "f32" => "a number".into(),
        "bool" | "boolean" => "true or false".into(),
        "string" | "str" | "char" => "a string (in quotes)".into(),
        "sequence" => "a list".into(),
        "map" => "a table".into(),
        _ => expected.replace('`', ""),
    }
}

/// The value found, as it was written.
fn got(actual: &Actual) -> String {
    match actual {
        Actual::Str(s) => format!("\"{s}\""),
        Actual::Unsigned(v) => v.to_string(),
        Actual::Signed(v) => v.to_string(),
        Actual::Float(v) => v.to_string(),
        Actual::Bool(v) => v.to_string(),
        Actual::Char(c) => format!("\"{c}\""),
        Actual::Seq => "a list".into(),
        Actual::Map => "a table".into(),
        other => other.to_string().replace('`', ""),
    }
}

/// An unknown key (or enum value): the nearest known one when one is close, else the list.
fn unknown(what: &str, found: &str, known: &[&str]) -> String {
    match nearest(found, known) {
        Some(near) => format!("unknown {what} `{found}`; did you mean `{near}`?"),
        None if known.is_empty() => format!("unknown {what} `{found}`"),
        None => format!("unknown {what} `{found}`; known here: {}", known.join(", ")),
    }
}

/// For a required key nobody set: the ignored variable that was most likely meant to set it
/// (`HOLDFAST_UPSTRAEM` for `upstream`). The environment reads only variables that name a key
/// and merely warns of the others, so a mistyped one left the key unset a line below the
/// warning that named it; the error says which.
pub(super) fn mistyped_variable(key: &str, unknown: &[String]) -> Option<String> {
    let wanted = format!(
        "{}{}",
        super::ENV_PREFIX,
        key.to_ascii_uppercase().replace('.', "__")
    );
    unknown
        .iter()
        .filter_map(|name| {
            let rest = name.get(super::ENV_PREFIX.len()..)?;
            nearest(rest, &[key]).map(|_| (edits(&rest.to_ascii_lowercase(), key), name))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| format!("did you mean {wanted} ({name} is set, and names no key)?"))
}

/// The known name `found` most likely meant: one it begins (`timeout` → `timeout_secs`), or
/// the closest within a third of its length in edits.
pub(super) fn nearest<'a>(found: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = found.to_ascii_lowercase().replace('-', "_");
    if let Some(k) = known.iter().find(|k| **k == lower) {
        return Some(k);
    }
    if let Some(k) = known
        .iter()
        .filter(|k| k.starts_with(&lower) && lower.len() >= 3)
        .min_by_key(|k| k.len())
    {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (edits(&lower, k), *k))
        .filter(|(d, _)| *d <= (lower.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(prev + usize::from(ca != *cb));
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_keys() {
        let keys = ["enabled", "timeout_secs", "max_requests", "max_body_bytes"];
        assert_eq!(nearest("timeout", &keys), Some("timeout_secs"));
        assert_eq!(nearest("max_request", &keys), Some("max_requests"));
        assert_eq!(nearest("enabeld", &keys), Some("enabled"));
        assert_eq!(nearest("max-body-bytes", &keys), Some("max_body_bytes"));
        assert_eq!(nearest("colour", &keys), None);
        assert_eq!(edits("kitten", "sitting"), 3);
    }

    #[test]
    fn a_mistyped_variable_is_found_for_its_key() {
        let unknown = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        for set in [
            "HOLDFAST_UPSTRAEM",
            "HOLDFAST_UPSTREAM_URL",
            "HOLDFAST_upstream_",
        ] {
            let said = mistyped_variable("upstream", &unknown(&["HOLDFAST_IMAGE", set]));
            assert_eq!(
                said.as_deref(),
                Some(
                    format!("did you mean HOLDFAST_UPSTREAM ({set} is set, and names no key)?")
                        .as_str()
                ),
                "{set}"
            );
        }
        assert_eq!(
            mistyped_variable("upstream", &unknown(&["HOLDFAST_IMAGE"])),
            None
        );
        assert_eq!(mistyped_variable("upstream", &[]), None);
    }

    #[test]
    fn types_in_words() {
        let k = Kind::InvalidType(Actual::Str("many".into()), "usize".into());
        assert_eq!(
            describe(&k),
            "expected a whole number (0 or more), got \"many\""
        );
        let k = Kind::InvalidValue(Actual::Signed(-1), "usize".into());
        assert_eq!(describe(&k), "expected a whole number (0 or more), got -1");
        let k = Kind::InvalidType(Actual::Str("yes".into()), "a boolean".into());
        assert_eq!(describe(&k), "expected true or false, got \"yes\"");
        let k = Kind::UnknownField("colour".into(), &["enabled", "timeout_secs"]);
        assert_eq!(
            describe(&k),
            "unknown key `colour`; known here: enabled, timeout_secs"
        );
    }
}
