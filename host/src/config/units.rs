//! Durations (`"500ms"`, `"5s"`, `"1m30s"`) and byte sizes (`"64MiB"`, `4096`) as they are
//! written in wasmctrl's TOML files.
//!
//! Invariants: parsing is strict (no silent truncation, no overflow, no unknown unit) and
//! `Display` writes a string that parses back to the same value, so files round-trip.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a duration or size string was refused. The message is shown to users as is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

/// A duration written as a sequence of `<number><unit>` with unit `ms`, `s`, `m` or `h`
/// (`"500ms"`, `"5s"`, `"10m"`, `"1h30m"`). `"0"` and `"0s"` are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DurationValue(pub Duration);

impl DurationValue {
    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl From<Duration> for DurationValue {
    fn from(d: Duration) -> Self {
        DurationValue(d)
    }
}

const DURATION_HINT: &str =
    "write a number followed by a unit: \"500ms\", \"5s\", \"10m\", \"1h\" or a sum like \"1m30s\"";

impl FromStr for DurationValue {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        if text == "0" {
            return Ok(DurationValue(Duration::ZERO));
        }
        if text.is_empty() {
            return Err(UnitError(format!("empty duration: {DURATION_HINT}")));
        }
        let mut rest = text;
        let mut total_ms: u128 = 0;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            if digits == 0 {
                return Err(UnitError(format!("invalid duration `{text}`: {DURATION_HINT}")));
            }
            let number: u128 =
                rest[..digits].parse().map_err(|_| UnitError(format!("duration `{text}` is too large")))?;
            rest = &rest[digits..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
            let unit = &rest[..unit_len];
            let scale: u128 = match unit {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "" => {
                    return Err(UnitError(format!("duration `{text}` has no unit: {DURATION_HINT}")));
                }
                other => {
                    return Err(UnitError(format!(
                        "unknown duration unit `{}` in `{text}`: {DURATION_HINT}",
                        other.trim()
                    )));
                }
            };
            rest = &rest[unit_len..];
            total_ms = number
                .checked_mul(scale)
                .and_then(|ms| total_ms.checked_add(ms))
                .filter(|ms| *ms <= u128::from(u64::MAX))
                .ok_or_else(|| UnitError(format!("duration `{text}` is too large")))?;
        }
        // Bounded by u64::MAX above.
        Ok(DurationValue(Duration::from_millis(total_ms as u64)))
    }
}

impl fmt::Display for DurationValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        // The largest unit that divides the value exactly, so the string parses back.
        for (unit, scale) in [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
            if ms.is_multiple_of(scale) {
                return write!(f, "{}{unit}", ms / scale);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for DurationValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DurationValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"5s\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map_err(|e: UnitError| E::custom(e))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                if v == 0 {
                    Ok(DurationValue(Duration::ZERO))
                } else {
                    Err(E::custom(format!("a duration needs a unit: write \"{v}s\" or \"{v}ms\", not {v}")))
                }
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A number of bytes, written as a plain integer or as `<number><unit>` with unit `B`,
/// `KiB`, `MiB`, `GiB` (binary) or `KB`, `MB`, `GB` (decimal). Kubernetes' `Ki`/`Mi`/`Gi`
/// are accepted too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

const SIZE_HINT: &str = "write bytes as an integer or with a unit: \"512KiB\", \"64MiB\", \"1GiB\"";

impl FromStr for ByteSize {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        if digits == 0 {
            return Err(UnitError(format!("invalid size `{text}`: {SIZE_HINT}")));
        }
        let number: u64 =
            text[..digits].parse().map_err(|_| UnitError(format!("size `{text}` is too large")))?;
        let scale: u64 = match text[digits..].trim_start() {
            "" | "B" => 1,
            "KiB" | "Ki" => 1 << 10,
            "MiB" | "Mi" => 1 << 20,
            "GiB" | "Gi" => 1 << 30,
            "KB" | "kB" | "K" | "k" => 1_000,
            "MB" | "M" => 1_000_000,
            "GB" | "G" => 1_000_000_000,
            other => {
                return Err(UnitError(format!("unknown size unit `{other}` in `{text}`: {SIZE_HINT}")));
            }
        };
        number
            .checked_mul(scale)
            .map(ByteSize)
            .ok_or_else(|| UnitError(format!("size `{text}` is too large")))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if b >= scale && b.is_multiple_of(scale) {
                return write!(f, "{}{unit}", b / scale);
            }
        }
        write!(f, "{b}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64MiB\" or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map_err(|e: UnitError| E::custom(e))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative ({v})")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(ByteSize(v))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_durations() {
        let d = |s: &str| s.parse::<DurationValue>().map(|d| d.0);
        assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(d("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(d("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(d("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(d("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(d("0s"), Ok(Duration::ZERO));
        assert_eq!(d("0"), Ok(Duration::ZERO));
        assert!(d("5").is_err());
        assert!(d("5x").is_err());
        assert!(d("s").is_err());
        assert!(d("-5s").is_err());
        assert!(d("1.5s").is_err());
        assert!(d("99999999999999999999999h").is_err());
    }

    #[test]
    fn parses_sizes() {
        let s = |s: &str| s.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(s("4096"), Ok(4096));
        assert_eq!(s("512KiB"), Ok(512 * 1024));
        assert_eq!(s("64MiB"), Ok(64 << 20));
        assert_eq!(s("64Mi"), Ok(64 << 20));
        assert_eq!(s("1GiB"), Ok(1 << 30));
        assert_eq!(s("2MB"), Ok(2_000_000));
        assert!(s("64mb").is_err());
        assert!(s("MiB").is_err());
        assert!(s("99999999999GiB").is_err());
    }

    proptest! {
        #[test]
        fn duration_display_round_trips(ms in 0u64..10_000_000_000) {
            let d = DurationValue(Duration::from_millis(ms));
            prop_assert_eq!(d.to_string().parse::<DurationValue>(), Ok(d));
        }

        #[test]
        fn size_display_round_trips(b in any::<u64>()) {
            let s = ByteSize(b);
            prop_assert_eq!(s.to_string().parse::<ByteSize>(), Ok(s));
        }
    }
}
