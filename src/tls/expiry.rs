//! A certificate's expiry, read from its DER without a parser crate: for the expiry gauge and
//! the warning when the serving certificate has expired.

/// A certificate's notAfter as Unix time, read straight from its DER (RFC 5280 §4.1: Certificate
/// → TBSCertificate → (version), serialNumber, signature, issuer, validity → notAfter). `None` if
/// the structure is not as expected.
pub fn not_after(cert: &[u8]) -> Option<i64> {
    let (cert, _) = der_expect(cert, 0x30)?;
    let (mut tbs, _) = der_expect(cert, 0x30)?;
    // version: [0] EXPLICIT, absent for v1 certificates.
    if tbs.first() == Some(&0xa0) {
        tbs = der(tbs)?.2;
    }
    let (_serial, rest) = der_expect(tbs, 0x02)?;
    let (_signature, rest) = der_expect(rest, 0x30)?;
    let (_issuer, rest) = der_expect(rest, 0x30)?;
    let (validity, _) = der_expect(rest, 0x30)?;
    let (_, _not_before, rest) = der(validity)?;
    let (tag, not_after, _) = der(rest)?;
    der_time(tag, not_after)
}

/// One DER element: (tag, contents, what follows). Single-byte tags and definite lengths only,
/// which is all a certificate's outer structure uses.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, &b| (len << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

fn der_expect(input: &[u8], want: u8) -> Option<(&[u8], &[u8])> {
    let (tag, contents, rest) = der(input)?;
    (tag == want).then_some((contents, rest))
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`), the two
/// forms RFC 5280 allows, as Unix time.
fn der_time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = |s: &[u8]| -> Option<i64> {
        s.iter().try_fold(0i64, |n, &b| {
            b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0'))
        })
    };
    let (year, rest) = match (tag, text.len()) {
        (0x17, 13) => {
            let yy = digits(&text[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        (0x18, 15) => (digits(&text[..4])?, &text[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let field = |i: usize| digits(&rest[i..i + 2]);
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Seconds may be 60 (a leap second).
    if second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix time as `YYYY-MM-DDTHH:MM:SSZ`, for logs.
pub(super) fn utc(t: i64) -> String {
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    // Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_until(year: i32, month: u8, day: u8) -> rcgen::Certificate {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap()
    }

    #[test]
    fn not_after_reads_utc_and_generalized_time() {
        // rcgen writes UTCTime before 2050 and GeneralizedTime from 2050 on.
        for (y, m, d, unix) in [
            (2031, 5, 17, 1_936_742_400),
            (2049, 12, 31, 2_524_521_600),
            (2050, 1, 1, 2_524_608_000),
            (2077, 2, 28, 3_381_696_000),
        ] {
            let cert = cert_until(y, m, d);
            assert_eq!(not_after(cert.der()), Some(unix), "{y}-{m}-{d}");
            assert_eq!(utc(unix), format!("{y:04}-{m:02}-{d:02}T00:00:00Z"));
        }
    }

    #[test]
    fn not_after_rejects_what_is_not_a_certificate() {
        assert_eq!(not_after(b""), None);
        assert_eq!(not_after(b"\x30\x82\xff\xff"), None);
        assert_eq!(not_after(&[0x30, 0x03, 0x02, 0x01, 0x00]), None);
        let cert = cert_until(2031, 5, 17);
        let der = cert.der();
        assert_eq!(not_after(&der[..der.len() / 2]), None, "truncated");
        assert_eq!(der_time(0x17, b"310517000000+"), None);
        assert_eq!(der_time(0x17, b"311317000000Z"), None, "month 13");
        assert_eq!(der_time(0x18, b"2031051700000Z"), None, "short");
        assert_eq!(der_time(0x17, b"500101000000Z"), Some(-631_152_000));
    }
}
