//! Times and durations as people write them: RFC 3339 timestamps, Unix nanoseconds, and
//! durations like `250ms` or `2s`. [`now`] reads the wall clock through the storage crate's
//! `SystemClock`, the one place that reads the system time.

use std::time::Duration;

use weft_storage::clock::{Clock, SystemClock};

/// The wall clock, in Unix nanoseconds.
pub fn now() -> u64 {
    SystemClock.now().0
}

/// Parses `250ms`, `2s`, `1.5s`, `3m`, `1h`, `10us`, `500ns` (a bare number is nanoseconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 250ms, 2s or 1h"))?;
    let nanos_per = match unit.trim() {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        "d" => 86400e9,
        u => {
            return Err(format!(
                "{text:?} has unknown unit {u:?}: use ns, us, ms, s, m, h or d"
            ));
        }
    };
    Ok(Duration::from_nanos((value * nanos_per).round() as u64))
}

/// Parses an RFC 3339 timestamp (`2026-11-30T02:40:00.123456789Z`, any offset) or Unix
/// nanoseconds, into Unix nanoseconds.
pub fn parse_time(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse()
            .map_err(|_| format!("{text:?} is too large for Unix nanoseconds"));
    }
    parse_rfc3339(t).ok_or_else(|| format!("{text:?} is neither RFC 3339 nor Unix nanoseconds"))
}

pub fn parse_rfc3339(t: &str) -> Option<u64> {
    let b = t.as_bytes();
    // only ASCII digits: `parse` would also take a sign
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let digits = t.get(r)?;
        if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if b.get(i) == Some(&b'.') {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = num(i + 1..i + 1 + digits)? * 10i64.pow(9 - digits as u32);
        i += 1 + digits;
    }
    let offset = match t.get(i..)? {
        "Z" | "z" => 0,
        // bytes, not string slices: a multi-byte character here must not split a slice
        tz if tz.len() == 6
            && matches!(tz.as_bytes()[0], b'+' | b'-')
            && tz.as_bytes()[3] == b':' =>
        {
            let sign = if tz.as_bytes()[0] == b'-' { -1 } else { 1 };
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    let secs =
        days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset;
    // past 2262-04-11 Unix nanoseconds no longer fit: an error, not an overflow
    let nanos = secs.checked_mul(1_000_000_000)?.checked_add(nanos)?;
    u64::try_from(nanos).ok()
}

/// Formats Unix nanoseconds as RFC 3339 UTC with nanoseconds.
pub fn format_rfc3339(nanos: u64) -> String {
    let secs = (nanos / 1_000_000_000) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        nanos % 1_000_000_000
    )
}

// Howard Hinnant's algorithms for the proleptic Gregorian calendar.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("2 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn rfc3339_round_trips_and_offsets_apply() {
        let t = parse_time("2026-11-30T02:40:00.123456789Z").unwrap();
        assert_eq!(format_rfc3339(t), "2026-11-30T02:40:00.123456789Z");
        assert_eq!(
            parse_time("2026-11-30T04:40:00.123456789+02:00").unwrap(),
            t
        );
        assert_eq!(parse_time("1970-01-01T00:00:01Z").unwrap(), 1_000_000_000);
        assert_eq!(
            parse_time("1764470400000000000").unwrap(),
            1_764_470_400_000_000_000
        );
        assert!(parse_time("2026-13-01T00:00:00Z").is_err());
        assert!(parse_time("yesterday").is_err());
        assert_eq!(
            format_rfc3339(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000000Z"
        );
    }

    #[test]
    fn odd_timestamps_are_errors_not_panics() {
        for text in [
            "2026-11-30T02:40:00é1234",
            "2026-11-30T02:40:00+é:000",
            "2026-11-30T02:40:00.5+0é:00",
            "2026-11-30T02:40:00.9999999999Z",
            "2262-04-12T00:00:00Z",
            "9999-12-31T23:59:59.999999999Z",
            "2026-11-30T02:40:00+99:00",
            "2026-11-30T02:40:+0Z",
            "+026-11-30T02:40:00Z",
            "2026-11-30T02:40:00",
            "99999999999999999999999",
        ] {
            assert!(parse_time(text).is_err(), "{text}");
        }
        assert!(
            parse_time("2262-04-11T23:47:16Z").is_ok(),
            "the last second that fits"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(weft_storage::fuzz_cases(256)))]

        #[test]
        fn no_panics_from_time_and_duration_text(text in "\\PC{0,40}", digits in "[0-9:.TZ+-]{0,32}") {
            let _ = parse_time(&text);
            let _ = parse_time(&digits);
            let _ = parse_time(&format!("2026-11-30T02:40:00{text}"));
            let _ = parse_duration(&text);
            let _ = parse_duration(&digits);
        }
    }
}
