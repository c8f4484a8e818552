//! Strict RFC 3339 date-times, normalised to UTC for the canonical form.
//!
//! Written here rather than taken from a date library because the libraries disagree on exactly
//! the cases that matter for a digest: they accept a space separator, keep or smear a leap
//! second, truncate a tenth fractional digit, and print fractions in groups of three. This
//! module accepts exactly
//! `YYYY-MM-DD('T'|'t')HH:MM:SS('.' 1–9 digits)?('Z'|'z'|('+'|'-')HH:MM)` with a real calendar
//! date, hour ≤ 23, minute ≤ 59, second ≤ 59 (no leap second) and an offset up to ±23:59, and
//! prints `YYYY-MM-DDTHH:MM:SS[.fraction]Z` with trailing fraction zeros removed. An instant
//! whose UTC year leaves 0000–9999 is rejected, so the output is always RFC 3339 too.

/// Every way this reader accepts to write a UTC offset of `minutes`, with the date-time
/// separator each goes with: for 0, `tz`, `T-00:00`, `T+00:00` and `TZ` (the lower-case letters
/// together); otherwise `T±HH:MM`. What a test draws from to write one instant many ways.
pub fn offset_spellings(minutes: i64) -> Vec<(char, String)> {
    if minutes == 0 {
        return vec![
            ('t', "z".to_owned()),
            ('T', "-00:00".to_owned()),
            ('T', "+00:00".to_owned()),
            ('T', "Z".to_owned()),
        ];
    }
    let sign = if minutes < 0 { '-' } else { '+' };
    let (h, m) = (minutes.abs() / 60, minutes.abs() % 60);
    vec![('T', format!("{sign}{h:02}:{m:02}"))]
}

/// Microseconds since 1970-01-01T00:00:00Z of a strict RFC 3339 date-time (any offset; digits
/// past the sixth of the fraction are cut), or `None` when `s` is not one.
pub fn unix_micros(s: &str) -> Option<i64> {
    let utc = normalize_rfc3339(s)?;
    let b = utc.as_bytes();
    let num = |r: std::ops::Range<usize>| utc.get(r)?.parse::<i64>().ok();
    let days = days_from_epoch(num(0..4)?, num(5..7)?, num(8..10)?);
    let seconds = days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    let mut micros = 0i64;
    if b.get(19) == Some(&b'.') {
        let digits = &utc[20..utc.len() - 1];
        for i in 0..6 {
            micros = micros * 10 + digits.as_bytes().get(i).map_or(0, |d| i64::from(d - b'0'));
        }
    }
    Some(seconds * 1_000_000 + micros)
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar (negative before it).
/// For tools that write dates (the development platform, the kit); no check of the date.
pub fn days_from_epoch(year: i64, month: i64, day: i64) -> i64 {
    days_from_civil(year, month, day) - days_from_civil(1970, 1, 1)
}

/// The date (year, month, day) of a day counted from 1970-01-01: the inverse of
/// [`days_from_epoch`].
pub fn date_from_epoch_days(days: i64) -> (i64, i64, i64) {
    civil_from_days(days + days_from_civil(1970, 1, 1))
}

/// The UTC form of a strict RFC 3339 date-time, or `None` when `s` is not one.
pub fn normalize_rfc3339(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        let mut v = 0i64;
        for &c in part {
            if !c.is_ascii_digit() {
                return None;
            }
            v = v * 10 + i64::from(c - b'0');
        }
        Some(v)
    };
    let year = num(0..4)?;
    let month = num(5..7)?;
    let day = num(8..10)?;
    let hour = num(11..13)?;
    let minute = num(14..16)?;
    let second = num(17..19)?;
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let mut pos = 19;
    let mut fraction = "";
    if b[pos] == b'.' {
        let start = pos + 1;
        let mut end = start;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        if end == start || end - start > 9 {
            return None;
        }
        fraction = &s[start..end];
        pos = end;
    }
    let offset_minutes = match b.get(pos..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let oh = num(pos + 1..pos + 3)?;
            let om = num(pos + 4..pos + 6)?;
            if oh > 23 || om > 59 {
                return None;
            }
            let m = oh * 60 + om;
            if *sign == b'-' {
                -m
            } else {
                m
            }
        }
        _ => return None,
    };

    // Local time minus offset is UTC. Work in whole minutes since 0000-03-01 (proleptic
    // Gregorian); seconds and the fraction never change.
    let local = days_from_civil(year, month, day) * 1440 + hour * 60 + minute;
    let utc = local - offset_minutes;
    let days = utc.div_euclid(1440);
    let minute_of_day = utc.rem_euclid(1440);
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        return None;
    }
    let fraction = fraction.trim_end_matches('0');
    // One allocation: the UTC form is never longer than the input plus one byte.
    let mut out = String::with_capacity(s.len() + 1);
    use std::fmt::Write as _;
    let _ = write!(
        out,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{second:02}",
        minute_of_day / 60,
        minute_of_day % 60
    );
    if !fraction.is_empty() {
        out.push('.');
        out.push_str(fraction);
    }
    out.push('Z');
    Some(out)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 0000-03-01 for a proleptic Gregorian date. Counting years from March puts the
/// leap day last, so a year's length is known before its February is reached.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let year_of_era = y.rem_euclid(400);
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let (month, carry) = if mp < 10 { (mp + 3, 0) } else { (mp - 9, 1) };
    (era * 400 + year_of_era + carry, month, day)
}

#[cfg(test)]
mod tests {
    #[test]
    fn unix_micros_counts_from_the_epoch_in_utc() {
        use super::unix_micros;
        assert_eq!(unix_micros("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_micros("1970-01-01T01:00:00.5+01:00"), Some(500_000));
        assert_eq!(
            unix_micros("2026-12-05T10:00:00.1234569Z"),
            Some(1_796_464_800_123_456)
        );
        assert_eq!(unix_micros("1969-12-31T23:59:59Z"), Some(-1_000_000));
        assert_eq!(unix_micros("2026-12-05 10:00:00Z"), None);
    }

    #[test]
    fn days_count_from_the_epoch_both_ways() {
        for days in [-719_468, -1, 0, 59, 10_956, 20_819, 2_932_896] {
            let (y, m, d) = super::date_from_epoch_days(days);
            assert_eq!(super::days_from_epoch(y, m, d), days);
        }
        assert_eq!(super::days_from_epoch(1970, 1, 1), 0);
        assert_eq!(super::date_from_epoch_days(-1), (1969, 12, 31));
        assert_eq!(super::date_from_epoch_days(20_819), (2027, 1, 1));
    }

    use super::*;

    #[test]
    fn calendar_round_trips_every_day_of_four_centuries() {
        let mut expected = days_from_civil(1900, 1, 1);
        for year in 1900..2300 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    let n = days_from_civil(year, month, day);
                    assert_eq!(n, expected, "{year}-{month}-{day}");
                    assert_eq!(civil_from_days(n), (year, month, day));
                    expected += 1;
                }
            }
        }
    }

    #[test]
    fn accepts_and_normalises() {
        let cases = [
            (
                "2026-12-02T15:17:05.123456+01:00",
                "2026-12-02T14:17:05.123456Z",
            ),
            ("2026-01-01T00:30:00+01:00", "2025-12-31T23:30:00Z"),
            ("2026-12-02t14:17:05z", "2026-12-02T14:17:05Z"),
            ("2026-12-02T14:17:05.120+00:00", "2026-12-02T14:17:05.12Z"),
            ("2026-12-02T14:17:05.000Z", "2026-12-02T14:17:05Z"),
            ("2026-12-02T14:17:05-00:00", "2026-12-02T14:17:05Z"),
            ("2024-02-29T23:00:00-01:30", "2024-03-01T00:30:00Z"),
            ("0000-01-01T00:00:00Z", "0000-01-01T00:00:00Z"),
            (
                "9999-12-31T23:59:59.999999999Z",
                "9999-12-31T23:59:59.999999999Z",
            ),
            ("2026-12-02T08:00:00+08:00", "2026-12-02T00:00:00Z"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_rfc3339(input).as_deref(), Some(want), "{input}");
        }
    }

    #[test]
    fn rejects_what_is_not_strict_rfc3339() {
        let cases = [
            "2026-12-31T23:59:60Z",
            "2026-12-02T14:17:05.1234567891Z",
            "2026-12-02 14:17:05Z",
            "2026-12-02T14:17:05+24:00",
            "2026-12-02T14:17:05+01:60",
            "2026-12-02T14:17:05+0100",
            "2026-02-30T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "9999-12-31T23:59:59-01:00",
            "0000-01-01T00:30:00+01:00",
            "2026-12-02T14:17Z",
            "2026-12-02T14:17:05",
            "2026-12-02T14:17:05.Z",
            "2026-12-02T24:00:00Z",
            "2026-13-02T14:17:05Z",
            "2026-00-02T14:17:05Z",
            "2026-12-00T14:17:05Z",
            "+2026-12-02T14:17:05Z",
            "2026-12-02T14:17:05ZZ",
            "2026-12-02T14:17:05Z ",
            "２０２6-12-02T14:17:05Z",
        ];
        for input in cases {
            assert_eq!(normalize_rfc3339(input), None, "{input}");
        }
    }
}
