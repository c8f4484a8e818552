//! `--vary-events SEED`: the platform writes each event it emits the way some other JSON writer
//! would, drawn from the seed: members in another order, whitespace between tokens, letters of
//! its strings written as `\u` escapes (either case of hex), and `occurred_at` in another
//! offset (`Z`, `z`, `±HH:MM`, `-00:00`) with a fraction of 0 to 9 digits. Every form is one the
//! canonical form accepts (docs/canonical-json.md), and each says the same instant to the
//! microsecond it was drawn from, give or take the digits dropped or added; the canonical bytes
//! a receiver stores differ from a plain writer's only where the instant does. Without the flag
//! events are written as before (compact, in the struct's order, UTC with six digits).

use std::sync::Mutex;

/// The writer's choices, one draw per event.
pub struct Vary {
    rng: Mutex<fastrand::Rng>,
}

/// Offsets `occurred_at` may carry, in minutes east of UTC; UTC is written as `Z`, `z` (with a
/// lowercase `t`), `+00:00` or `-00:00`, drawn apart.
const OFFSETS: &[i32] = &[0, 0, 60, -300, 330, -210, 540, 345, -720, 840, 1439, -1439];

impl Vary {
    pub fn new(seed: u64) -> Vary {
        Vary {
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }

    /// The event's text from its members (name, JSON text of the value), with `occurred_at`
    /// (`YYYY-MM-DDTHH:MM:SS.ffffffZ`, UTC) written in a drawn offset and precision.
    pub fn render(&self, members: Vec<(&str, String)>, occurred_at: &str) -> String {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut members: Vec<(String, String)> = members
            .into_iter()
            .map(|(n, v)| {
                let v = if v.starts_with('"') {
                    escape_some(&mut rng, &v)
                } else {
                    v
                };
                (escape_some(&mut rng, &format!("\"{n}\"")), v)
            })
            .collect();
        members.push((
            escape_some(&mut rng, "\"occurred_at\""),
            format!("\"{}\"", timestamp(&mut rng, occurred_at)),
        ));
        rng.shuffle(&mut members);
        let (colon, comma) = match rng.u8(0..3) {
            0 => (":", ","),
            1 => (": ", ", "),
            _ => (" : ", ",\n  "),
        };
        let body: Vec<String> = members
            .into_iter()
            .map(|(n, v)| format!("{n}{colon}{v}"))
            .collect();
        let open = if comma.contains('\n') { "{\n  " } else { "{" };
        let close = if comma.contains('\n') { "\n}" } else { "}" };
        format!("{open}{}{close}", body.join(comma))
    }
}

/// `quoted` (a JSON string, quotes included) with one in three of its letters, digits, `.`,
/// `_` and `-` written as a `\u00hh` escape, in lowercase or uppercase hex.
fn escape_some(rng: &mut fastrand::Rng, quoted: &str) -> String {
    let mut out = String::with_capacity(quoted.len() + 16);
    let inner = &quoted[1..quoted.len() - 1];
    let mut escaped = false;
    out.push('"');
    for c in inner.chars() {
        let plain = c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if plain && !escaped && rng.u8(0..3) == 0 {
            if rng.bool() {
                out.push_str(&format!("\\u{:04x}", c as u32));
            } else {
                out.push_str(&format!("\\u{:04X}", c as u32));
            }
        } else {
            out.push(c);
        }
        // After a backslash the next character belongs to its escape.
        escaped = c == '\\' && !escaped;
    }
    out.push('"');
    out
}

/// `utc` (`YYYY-MM-DDTHH:MM:SS.ffffffZ`) in a drawn offset with 0 to 9 fraction digits. The
/// last digit of a fraction is drawn non-zero four times in five and zero the fifth, so that
/// both forms come up on purpose, never by chance only.
fn timestamp(rng: &mut fastrand::Rng, utc: &str) -> String {
    let field = |r: std::ops::Range<usize>| utc.get(r).and_then(|s| s.parse::<i64>().ok());
    let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(s)) = (
        field(0..4),
        field(5..7),
        field(8..10),
        field(11..13),
        field(14..16),
        field(17..19),
    ) else {
        return utc.to_owned();
    };
    let micros = utc.get(20..26).unwrap_or("000000");
    let offset = OFFSETS[rng.usize(0..OFFSETS.len())];
    let minutes =
        canonical_form::days_from_epoch(y, mo, d) * 1440 + h * 60 + mi + i64::from(offset);
    let (days, minute_of_day) = (minutes.div_euclid(1440), minutes.rem_euclid(1440));
    let (y, mo, d) = canonical_form::date_from_epoch_days(days);
    let digits = rng.usize(0..10);
    let mut fraction: String = micros.chars().take(digits).collect();
    while fraction.len() < digits {
        fraction.push(char::from(b'0' + rng.u8(0..10)));
    }
    if digits > 0 {
        let last = if rng.u8(0..5) == 0 {
            '0'
        } else {
            char::from(b'0' + rng.u8(1..10))
        };
        fraction.pop();
        fraction.push(last);
    }
    // Drawn as four choices whatever the offset, so that a seed draws the same text as ever.
    let choice = usize::from(rng.u8(0..4));
    let spellings = canonical_form::offset_spellings(i64::from(offset));
    let (t, zone) = spellings[choice % spellings.len()].clone();
    let dot = if digits > 0 { "." } else { "" };
    format!(
        "{y:04}-{mo:02}-{d:02}{t}{:02}:{:02}:{s:02}{dot}{fraction}{zone}",
        minute_of_day / 60,
        minute_of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drawn_form_is_the_same_instant_to_the_canonical_form() {
        let vary = Vary::new(7);
        let utc = "2026-12-31T23:59:59.123456Z";
        let mut zones = std::collections::BTreeSet::new();
        for _ in 0..400 {
            let text = vary.render(
                vec![("id", "\"abc_1\"".into()), ("task_version", "3".into())],
                utc,
            );
            let doc = canonical_form::Document::parse(text.as_bytes()).expect("accepted");
            let canonical = String::from_utf8(doc.canonical().to_vec()).expect("UTF-8");
            assert!(
                canonical.starts_with("{\"id\":\"abc_1\",\"occurred_at\":\"20"),
                "{canonical}"
            );
            let raw: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            let at = raw["occurred_at"].as_str().expect("a string");
            zones.insert(
                at[19..]
                    .trim_start_matches(|c: char| c == '.' || c.is_ascii_digit())
                    .to_owned(),
            );
            // The same second whatever the offset: only the fraction's digits are drawn.
            let stored: serde_json::Value = serde_json::from_str(&canonical).expect("JSON");
            let stored = stored["occurred_at"].as_str().expect("a string");
            assert!(
                stored.starts_with("2026-12-31T23:59:59"),
                "{at} -> {stored}"
            );
        }
        assert!(zones.len() >= 8, "{zones:?}");
    }
}
