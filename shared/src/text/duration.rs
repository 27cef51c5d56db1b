//! Human durations as operators write them on the command line and in `fleet.yaml`: `30s`, `10m`, `24h`,
//! `30d`, and combinations such as `1h30m`. One parser for every flag and field, so they all read alike.

use std::time::Duration;

use crate::{Error, Result};

/// Parses `30s`, `250ms`, `10m`, `24h`, `7d`, `1h30m`. A bare `0` is zero; any other number needs a unit.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let invalid = |detail: &str| Error::InvalidDuration {
        value: text.to_owned(),
        detail: detail.to_owned(),
    };
    let trimmed = text.trim();
    if trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    if trimmed.is_empty() {
        return Err(invalid("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = trimmed;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid("expected a number, like 30s, 10m, 24h or 7d"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| invalid("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let millis_per_unit: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(invalid("missing unit: use ms, s, m, h or d")),
            _ => return Err(invalid("unknown unit: use ms, s, m, h or d")),
        };
        let millis = number
            .checked_mul(millis_per_unit)
            .ok_or_else(|| invalid("too large"))?;
        total = total
            .checked_add(Duration::from_millis(millis))
            .ok_or_else(|| invalid("too large"))?;
    }
    Ok(total)
}

/// Formats a duration in the largest whole units, the inverse of [`parse_duration`]: `90s` → `1m30s`.
pub fn format_duration(duration: Duration) -> String {
    let mut millis = duration.as_millis();
    if millis == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if millis >= size {
            out.push_str(&format!("{}{unit}", millis / size));
            millis %= size;
        }
    }
    out
}

/// Serde adapter for `Option<Duration>` fields written as human durations (`driftGracePeriod: 30s`).
pub mod serde_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        value: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => serializer.serialize_str(&super::format_duration(*duration)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(deserializer)?;
        text.map(|t| super::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Serde for a `Duration` field written as text (`#[serde(with = "crate::text::duration::text")]`): read with
/// [`parse_duration`], written with [`format_duration`].
pub mod text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format_duration(*value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5_400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in ["", "30", "s", "10x", "-5s", "1.5h", "99999999999999999999d"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidDuration { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn format_round_trips() {
        for text in ["0s", "1m30s", "30d", "2h", "1s500ms"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
