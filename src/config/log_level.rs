//! `log_level`: what tracing's `EnvFilter` accepts, less what is a typo in its grammar.
//!
//! `EnvFilter` reads a directive without `=` that is not a level as a *target* logged at every
//! level: `verbose` means "trace for the target `verbose`", which nothing logs to, and everything
//! else is silenced. So a misspelt level passed `check-config` and holdfast ran without a line on
//! stderr, a later bind failure included. Here every directive must say its level: a bare word is
//! a level or a problem, and `target=level` (spans and fields as `EnvFilter` has them) is the way
//! to name a target (`holdfast=trace` for what a bare `holdfast` would mean).

use std::str::FromStr;

use tracing_subscriber::filter::LevelFilter;

/// The levels, as the message lists them (`EnvFilter` takes any case, and 0 to 5).
const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error", "off"];

/// Other tools' names for a level, and what they mean here.
const SYNONYMS: &[(&str, &str)] = &[
    ("verbose", "debug"),
    ("all", "trace"),
    ("warning", "warn"),
    ("err", "error"),
    ("fatal", "error"),
    ("crit", "error"),
    ("critical", "error"),
    ("notice", "info"),
    ("information", "info"),
    ("none", "off"),
    ("quiet", "off"),
    ("silent", "off"),
    ("disabled", "off"),
];

/// Checks `value`; the message names the first directive at fault, with the nearest level.
pub(super) fn check(value: &str) -> Result<(), String> {
    let directives: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        // An empty filter silences everything too; `off` says so on purpose.
        return Err(format!("is empty: expected {}", expected()));
    }
    for directive in directives {
        if let Some(level) = stated_level(directive) {
            if LevelFilter::from_str(level).is_err() {
                return Err(format!(
                    "`{level}` in `{directive}` is not a level{}: expected {}",
                    suggestion(level),
                    expected()
                ));
            }
        } else if !directive.contains('[') && LevelFilter::from_str(directive).is_err() {
            return Err(format!(
                "`{directive}` is not a level{}: expected {} (a target needs its level: \
                 `{directive}=trace`)",
                suggestion(directive),
                expected()
            ));
        }
    }
    // The grammar's other errors (a span's unbalanced brackets, a field's bad regex).
    tracing_subscriber::EnvFilter::try_new(value)
        .map(drop)
        .map_err(|e| format!("does not parse as a filter ({e}): expected {}", expected()))
}

/// The level a `target=level` directive states, if it states one: after its last `=`, unless
/// that `=` is a field's (`[span{field=value}]`, which ends in a bracket and states none).
fn stated_level(directive: &str) -> Option<&str> {
    let (_, level) = directive.rsplit_once('=')?;
    (!level.contains(['}', ']'])).then_some(level)
}

/// "; did you mean `debug`?" for a synonym or a near miss, else nothing.
fn suggestion(word: &str) -> String {
    let lower = word.to_ascii_lowercase();
    let near = SYNONYMS
        .iter()
        .find(|(other, _)| *other == lower)
        .map(|(_, level)| *level)
        .or_else(|| super::messages::nearest(&lower, LEVELS));
    match near {
        Some(level) => format!("; did you mean `{level}`?"),
        None => String::new(),
    }
}

fn expected() -> String {
    format!(
        "one of {}, or a filter such as `warn,holdfast::access=info`",
        LEVELS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_users_write_is_accepted() {
        for ok in [
            "info",
            "INFO",
            "off",
            "trace",
            " warn ",
            "holdfast=debug,info",
            "warn,holdfast::access=info",
            "holdfast::proxy=TRACE,hyper=off",
            "info,[request]=debug",
            "[request{method=POST}]",
            "3",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn typos_are_refused_with_the_nearest_level() {
        for (bad, says) in [
            ("verbose", "did you mean `debug`?"),
            ("warning", "did you mean `warn`?"),
            ("infoo", "did you mean `info`?"),
            ("dbug", "did you mean `debug`?"),
            ("holdfast=verbose", "`verbose` in `holdfast=verbose`"),
            ("info,holdfast", "`holdfast=trace`"),
            ("", "is empty"),
            (",", "is empty"),
        ] {
            let message = check(bad).expect_err(bad);
            assert!(message.contains(says), "{bad}: {message}");
            assert!(message.contains("trace, debug, info"), "{bad}: {message}");
        }
        assert!(!check("loud").unwrap_err().contains("did you mean"));
    }
}
