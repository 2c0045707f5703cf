//! Durations as operators write them: every `*_secs` and `*_ms` key takes a number in the key's
//! unit (`20`, `0.5`) or a duration with its units (`"20s"`, `"1m30s"`, `"500ms"`, `"2h"`), as
//! Traefik, Envoy and Kubernetes take them. Read where serde reads the key, so the file, the
//! environment (`HOLDFAST_HOLD__TIMEOUT_SECS=20s`) and the flags all take both.
//!
//! A small parser of our own rather than a crate: the grammar is a few lines, and the messages
//! must say what holdfast takes.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Unexpected, Visitor};

/// The units a duration is written in, longest first where one begins another (`ms` before
/// `m`), and what each is worth in nanoseconds.
const UNITS: &[(&str, u128)] = &[
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60 * 1_000_000_000),
    ("h", 3_600 * 1_000_000_000),
    ("d", 86_400 * 1_000_000_000),
];

/// Parses `"1m30s"`, `"500ms"`, `"2h"`, `"1.5s"`, `"1h 30m"`: numbers (whole, or with a
/// fraction), each followed by its unit (`ms`, `s`, `m`, `h`, `d`). A bare number is not a
/// duration here: its unit is the key's, which the caller knows.
pub fn parse(text: &str) -> Result<Duration, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("an empty duration".into());
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_len];
        if number.is_empty() {
            return Err(format!("`{rest}` does not begin with a number"));
        }
        let after = &rest[number_len..];
        let Some((unit, worth)) = UNITS.iter().find(|(unit, _)| {
            after.starts_with(unit)
                && !after[unit.len()..].starts_with(|c: char| c.is_ascii_alphabetic())
        }) else {
            return Err(format!("`{number}` needs a unit: ms, s, m, h or d"));
        };
        nanos = nanos
            .checked_add(scaled(number, *worth)?)
            .ok_or("too long")?;
        rest = after[unit.len()..].trim_start();
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| "too long")?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// `number` (digits, perhaps a fraction) times `worth` nanoseconds, exactly: no float rounds
/// `0.1s` to a hair off.
fn scaled(number: &str, worth: u128) -> Result<u128, String> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(format!("`{number}` is not a number"));
    }
    let digits = |s: &str| -> Result<u128, String> {
        if s.is_empty() {
            return Ok(0);
        }
        s.parse::<u128>()
            .map_err(|_| format!("`{number}` is too long"))
    };
    let mut nanos = digits(whole)?
        .checked_mul(worth)
        .ok_or_else(|| format!("`{number}` is too long"))?;
    // Digits past a nanosecond are dropped.
    let mut place = worth;
    for c in fraction.chars() {
        place /= 10;
        nanos += u128::from(c.to_digit(10).unwrap_or(0)) * place;
    }
    Ok(nanos)
}

/// What the key's unit is: seconds or milliseconds, and whether only whole ones are taken.
#[derive(Clone, Copy)]
enum Unit {
    /// `*_secs` as a number of seconds, fractions allowed.
    Secs,
    /// `*_secs` as a whole number of seconds (`retry_after_secs`: a header's whole seconds).
    WholeSecs,
    /// `*_ms` as a whole number of milliseconds.
    WholeMs,
}

impl Unit {
    fn expecting(self) -> &'static str {
        match self {
            Unit::Secs => "a number of seconds or a duration such as \"20s\", \"1m30s\", \"500ms\"",
            Unit::WholeSecs => "a whole number of seconds or a duration such as \"20s\", \"1m30s\"",
            Unit::WholeMs => {
                "a whole number of milliseconds or a duration such as \"250ms\", \"1s\""
            }
        }
    }

    /// The duration as a number in this unit; `None` when it is not whole where it must be.
    fn of(self, d: Duration) -> Option<f64> {
        match self {
            Unit::Secs => Some(d.as_secs_f64()),
            Unit::WholeSecs => (d.subsec_nanos() == 0).then_some(d.as_secs() as f64),
            Unit::WholeMs => d
                .subsec_nanos()
                .is_multiple_of(1_000_000)
                .then_some(d.as_millis() as f64),
        }
    }
}

/// Reads a number, or a string holding a number or a duration, as a number in `unit`.
struct InUnit(Unit);

impl<'de> Visitor<'de> for InUnit {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.expecting())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        // A negative number is the validator's to refuse ("must be positive"), with the key.
        Ok(v as f64)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        if let Ok(n) = v.trim().parse::<f64>() {
            // `"20"`: a number, in the key's unit (an environment variable is a string).
            return Ok(n);
        }
        parse(v)
            .ok()
            .and_then(|d| self.0.of(d))
            .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
    }
}

/// A whole number for a `u64` key, or the error naming what was written.
fn whole<E: de::Error>(n: f64, unit: Unit) -> Result<u64, E> {
    if n.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(&n) {
        Ok(n as u64)
    } else if n < 0.0 {
        Err(E::invalid_value(
            Unexpected::Signed(n as i64),
            &InUnit(unit),
        ))
    } else {
        Err(E::invalid_value(Unexpected::Float(n), &InUnit(unit)))
    }
}

/// serde's `deserialize_with` for an `f64` seconds key.
pub fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    d.deserialize_any(InUnit(Unit::Secs))
}

/// serde's `deserialize_with` for a `u64` seconds key.
pub fn whole_secs<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole(d.deserialize_any(InUnit(Unit::WholeSecs))?, Unit::WholeSecs)
}

/// serde's `deserialize_with` for a `u64` milliseconds key.
pub fn whole_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole(d.deserialize_any(InUnit(Unit::WholeMs))?, Unit::WholeMs)
}

/// A flag's whole seconds (`--retry-after 5` or `--retry-after 5s`), for clap.
pub fn whole_secs_flag(text: &str) -> Result<u64, String> {
    whole_secs(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_operators_write_them() {
        for (text, want) in [
            ("20s", Duration::from_secs(20)),
            ("1m30s", Duration::from_secs(90)),
            ("1m 30s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("2h", Duration::from_secs(7200)),
            ("1d", Duration::from_secs(86_400)),
            ("0.1s", Duration::from_millis(100)),
            ("1.5m", Duration::from_secs(90)),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
            (" 7s ", Duration::from_secs(7)),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "20",
            "s",
            "20x",
            "20 seconds",
            "1.2.3s",
            "-5s",
            "5sec",
            "ms",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_take_whole_seconds_either_way() {
        assert_eq!(whole_secs_flag("5"), Ok(5));
        assert_eq!(whole_secs_flag("1m"), Ok(60));
        assert!(whole_secs_flag("1500ms")
            .unwrap_err()
            .contains("a whole number of seconds"));
        assert!(whole_secs_flag("soon").is_err());
    }
}
