//! Durations written the way Kubernetes flags write them (`500ms`, `5s`, `1m30s`, `2h`), so a value
//! copied from a kube-apiserver manifest means the same thing here.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A `std::time::Duration` that parses and prints Go-style duration strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct GoDuration(pub Duration);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {reason} (examples: 500ms, 5s, 1m30s)")]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

impl FromStr for GoDuration {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| DurationError {
            input: input.to_owned(),
            reason,
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        if s == "0" {
            return Ok(Self(Duration::ZERO));
        }
        let mut total = Duration::ZERO;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| err("missing unit"))?;
            if digits == 0 {
                return Err(err("expected a number"));
            }
            let value: f64 = rest[..digits].parse().map_err(|_| err("bad number"))?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let unit_seconds = match &rest[..unit_len] {
                "ns" => 1e-9,
                "us" | "µs" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(err("unknown unit (use ms, s, m or h)")),
            };
            rest = &rest[unit_len..];
            let part = Duration::try_from_secs_f64(value * unit_seconds)
                .map_err(|_| err("out of range"))?;
            total = total.checked_add(part).ok_or_else(|| err("out of range"))?;
        }
        Ok(Self(total))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            let s = d.as_secs();
            let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
            if s == 0 && m == 0 && h == 0 {
                return write!(f, "0s");
            }
            if h > 0 {
                write!(f, "{h}h")?;
            }
            if m > 0 {
                write!(f, "{m}m")?;
            }
            if s > 0 {
                write!(f, "{s}s")?;
            }
            Ok(())
        } else {
            write!(f, "{}ms", d.as_millis())
        }
    }
}

impl<'de> serde::Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Duration {
        s.parse::<GoDuration>()
            .unwrap_or_else(|e| panic!("{s:?}: {e}"))
            .0
    }

    #[test]
    fn parses_kubernetes_style_durations() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("5s", Duration::from_secs(5)),
            ("1m30s", Duration::from_secs(90)),
            ("2h", Duration::from_secs(7200)),
            ("1.5s", Duration::from_millis(1500)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(parse(text), want, "{text:?}");
        }
    }

    #[test]
    fn rejects_what_kube_rejects() {
        for bad in ["", "5", "s", "5x", "-1s", "1m30"] {
            assert!(bad.parse::<GoDuration>().is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn prints_round_trip() {
        for s in ["0s", "5s", "1m30s", "2h", "250ms"] {
            assert_eq!(s.parse::<GoDuration>().unwrap().to_string(), s, "{s:?}");
        }
    }
}
