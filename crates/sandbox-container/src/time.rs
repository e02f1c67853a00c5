//! Timestamps as engines report them: RFC 3339 (`2024-01-02T03:04:05.123456789Z`,
//! `…+01:00`) and seconds since the epoch: the one reading every adapter uses.

use std::time::{Duration, SystemTime};

/// Seconds since the Unix epoch as a `SystemTime`; `None` before the epoch.
pub fn from_unix_secs(secs: i64) -> Option<SystemTime> {
    u64::try_from(secs)
        .ok()
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
}

/// Parses an RFC 3339 timestamp; `None` for anything malformed or out of range.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse::<i64>().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let f = &frac[..digits.min(9)];
        nanos = format!("{f:0<9}").parse().ok()?;
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(o.as_bytes()[3], b':') => {
            let sign = match o.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh = o.get(1..3)?.parse::<i64>().ok()?;
            let om = o.get(4..6)?.parse::<i64>().ok()?;
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs.unsigned_abs(), nanos))
    } else {
        SystemTime::UNIX_EPOCH
            .checked_sub(Duration::from_secs(secs.unsigned_abs()))?
            .checked_add(Duration::from_nanos(u64::from(nanos)))
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(t: SystemTime) -> (u64, u32) {
        let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        (d.as_secs(), d.subsec_nanos())
    }

    #[test]
    fn epoch_seconds() {
        assert_eq!(
            from_unix_secs(1_700_000_000).map(secs),
            Some((1_700_000_000, 0))
        );
        assert_eq!(from_unix_secs(-1), None);
    }

    #[test]
    fn parses_engine_timestamps() {
        assert_eq!(
            secs(parse_rfc3339("1970-01-02T00:00:01Z").unwrap()),
            (86_401, 0)
        );
        assert_eq!(
            secs(parse_rfc3339("2024-02-29T12:00:00.5+01:00").unwrap()),
            (1_709_204_400, 500_000_000)
        );
        assert_eq!(
            secs(parse_rfc3339("2024-01-02T03:04:05.123456789123Z").unwrap()),
            (1_704_164_645, 123_456_789),
            "digits past nanoseconds are dropped"
        );
        assert_eq!(
            secs(parse_rfc3339("2000-03-01T00:00:00-00:30").unwrap()).0,
            951_870_600
        );
        assert!(parse_rfc3339("1969-12-31T23:59:59Z").unwrap() < SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn refuses_malformed() {
        for bad in [
            "yesterday",
            "",
            "2024-13-01T00:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+0100",
            "2024-01-01T00:00:00*01:00",
            "2024-01-01T0a:00:00Z",
            "+024-01-01T00:00:00Z",
            "2024-01-01T00:00:00Zjunk",
        ] {
            assert!(parse_rfc3339(bad).is_none(), "{bad:?}");
        }
    }
}
