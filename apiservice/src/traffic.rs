//! What an APIService's annotations say about its traffic: which of its requests are
//! long-running, and how its backend's connections are kept.
//!
//! kube-apiserver decides long-running from a fixed list (`watch` and `proxy` verbs; `attach`,
//! `exec`, `log`, `portforward`, `proxy` subresources), so an aggregated server's own streaming
//! subresources (KubeVirt's `console` and `vnc`) are cut by the request timeout
//! (kubernetes#73421, #83200). Here an APIService can name its own:
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     aggregation-gateway.io/long-running-subresources: console,vnc
//!     aggregation-gateway.io/long-running-verbs: list
//!     aggregation-gateway.io/max-connections-per-endpoint: "16"
//!     aggregation-gateway.io/http2-ping-interval: 5s
//!     aggregation-gateway.io/http2-ping-timeout: 2s
//! ```
//!
//! A value that does not parse is ignored, and says why in [`TrafficPolicy::ignored`], rather
//! than making the APIService unroutable: a typo in a tuning annotation must not take an API
//! down. Everything is bounded, since whoever may write APIServices writes these.

use std::collections::BTreeMap;
use std::time::Duration;

use gateway_config::GoDuration;

/// Subresources of this APIService's resources that are long-running (comma list).
pub const LONG_RUNNING_SUBRESOURCES: &str = "aggregation-gateway.io/long-running-subresources";
/// Verbs on this APIService's resources that are long-running (comma list).
pub const LONG_RUNNING_VERBS: &str = "aggregation-gateway.io/long-running-verbs";
/// HTTP/2 connections per backend endpoint.
pub const MAX_CONNECTIONS: &str = "aggregation-gateway.io/max-connections-per-endpoint";
/// How often an HTTP/2 connection to the backend is pinged.
pub const PING_INTERVAL: &str = "aggregation-gateway.io/http2-ping-interval";
/// How long a ping may go unanswered before the connection counts as dead.
pub const PING_TIMEOUT: &str = "aggregation-gateway.io/http2-ping-timeout";

/// Names in one long-running list at most.
const MAX_NAMES: usize = 16;
/// The verbs kube's request info can derive; `watch` and `proxy` are long-running already.
const VERBS: [&str; 9] = [
    "get",
    "list",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "watch",
    "proxy",
];
const MAX_CONNECTIONS_RANGE: (u16, u16) = (1, 1024);
const PING_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(300));
const PING_TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// What an APIService's annotations say about its traffic; the default when it has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrafficPolicy {
    pub long_running: LongRunning,
    pub connections: ConnectionSettings,
    /// Annotations that were ignored, each as `<annotation>: <why>`.
    pub ignored: Vec<String>,
}

/// Requests that are exempt from the request timeout and the in-flight limits, besides kube's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LongRunning {
    pub subresources: Vec<String>,
    pub verbs: Vec<String>,
}

/// How the backend's connections are kept; `None` keeps the gateway's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnectionSettings {
    pub max_connections_per_endpoint: Option<u16>,
    pub ping_interval: Option<Duration>,
    pub ping_timeout: Option<Duration>,
}

// === impl TrafficPolicy ===

impl TrafficPolicy {
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        let mut policy = Self::default();
        let mut ignored = Vec::new();
        let get = |name: &str| annotations.get(name).map(|v| v.trim());
        if let Some(value) = get(LONG_RUNNING_SUBRESOURCES) {
            match names(value, |s| {
                is_dns_label(s)
                    .then_some(())
                    .ok_or("is not a lowercase name (a-z, 0-9, -)")
            }) {
                Ok(list) => policy.long_running.subresources = list,
                Err(why) => ignored.push(format!("{LONG_RUNNING_SUBRESOURCES}: {why}")),
            }
        }
        if let Some(value) = get(LONG_RUNNING_VERBS) {
            match names(value, |s| {
                VERBS
                    .contains(&s)
                    .then_some(())
                    .ok_or("is not a Kubernetes verb (get, list, create, update, patch, delete, deletecollection)")
            }) {
                Ok(list) => policy.long_running.verbs = list,
                Err(why) => ignored.push(format!("{LONG_RUNNING_VERBS}: {why}")),
            }
        }
        if let Some(value) = get(MAX_CONNECTIONS) {
            let (min, max) = MAX_CONNECTIONS_RANGE;
            match value.parse::<u16>() {
                Ok(n) if (min..=max).contains(&n) => {
                    policy.connections.max_connections_per_endpoint = Some(n)
                }
                _ => ignored.push(format!(
                    "{MAX_CONNECTIONS}: {value:?} is not a whole number from {min} to {max}"
                )),
            }
        }
        for (name, range, slot) in [
            (
                PING_INTERVAL,
                PING_INTERVAL_RANGE,
                &mut policy.connections.ping_interval,
            ),
            (
                PING_TIMEOUT,
                PING_TIMEOUT_RANGE,
                &mut policy.connections.ping_timeout,
            ),
        ] {
            let Some(value) = get(name) else { continue };
            match value.parse::<GoDuration>() {
                Ok(GoDuration(d)) if (range.0..=range.1).contains(&d) => *slot = Some(d),
                Ok(_) => ignored.push(format!(
                    "{name}: {value:?} is outside {}s to {}s",
                    range.0.as_secs(),
                    range.1.as_secs()
                )),
                Err(e) => ignored.push(format!("{name}: {e}")),
            }
        }
        policy.ignored = ignored;
        policy
    }
}

// === impl LongRunning ===

impl LongRunning {
    pub fn is_empty(&self) -> bool {
        self.subresources.is_empty() && self.verbs.is_empty()
    }

    /// Whether a request with this verb and subresource is declared long-running.
    pub fn matches(&self, verb: &str, subresource: &str) -> bool {
        (!subresource.is_empty() && self.subresources.iter().any(|s| s == subresource))
            || self.verbs.iter().any(|v| v == verb)
    }
}

/// A comma list of at most [`MAX_NAMES`] names, each checked by `check`; duplicates dropped.
fn names(
    value: &str,
    check: impl Fn(&str) -> Result<(), &'static str>,
) -> Result<Vec<String>, String> {
    let mut list: Vec<String> = Vec::new();
    for name in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        check(name).map_err(|why| format!("{name:?} {why}"))?;
        if !list.iter().any(|n| n == name) {
            list.push(name.to_owned());
        }
        if list.len() > MAX_NAMES {
            return Err(format!("more than {MAX_NAMES} names"));
        }
    }
    Ok(list)
}

/// An RFC 1123 label, as resource and subresource names are.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(pairs: &[(&str, &str)]) -> TrafficPolicy {
        TrafficPolicy::from_annotations(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn no_annotations_is_the_default() {
        assert_eq!(policy(&[]), TrafficPolicy::default());
    }

    #[test]
    fn declared_subresources_and_verbs_are_long_running() {
        let p = policy(&[
            (LONG_RUNNING_SUBRESOURCES, " console, vnc,console "),
            (LONG_RUNNING_VERBS, "list"),
        ]);
        assert!(p.ignored.is_empty(), "{:?}", p.ignored);
        assert_eq!(p.long_running.subresources, ["console", "vnc"]);
        assert!(p.long_running.matches("get", "console"));
        assert!(p.long_running.matches("create", "vnc"));
        assert!(p.long_running.matches("list", ""));
        assert!(!p.long_running.matches("get", "status"));
        assert!(!p.long_running.matches("get", ""));
    }

    #[test]
    fn bad_values_are_ignored_with_the_reason() {
        let p = policy(&[
            (LONG_RUNNING_SUBRESOURCES, "console,VNC"),
            (LONG_RUNNING_VERBS, "stream"),
            (MAX_CONNECTIONS, "0"),
            (PING_INTERVAL, "100ms"),
            (PING_TIMEOUT, "soon"),
        ]);
        assert_eq!(p.long_running, LongRunning::default());
        assert_eq!(p.connections, ConnectionSettings::default());
        assert_eq!(p.ignored.len(), 5, "{:?}", p.ignored);
        assert!(p.ignored[0].contains("\"VNC\" is not a lowercase name"));
        assert!(p.ignored[1].contains("\"stream\" is not a Kubernetes verb"));
        let many = (0..=MAX_NAMES).map(|i| format!("s{i}")).collect::<Vec<_>>();
        let p = policy(&[(LONG_RUNNING_SUBRESOURCES, &many.join(","))]);
        assert!(
            p.ignored[0].contains("more than 16 names"),
            "{:?}",
            p.ignored
        );
    }

    #[test]
    fn connection_settings_parse_within_bounds() {
        let p = policy(&[
            (MAX_CONNECTIONS, "4"),
            (PING_INTERVAL, "2s"),
            (PING_TIMEOUT, "1s"),
        ]);
        assert!(p.ignored.is_empty(), "{:?}", p.ignored);
        assert_eq!(
            p.connections,
            ConnectionSettings {
                max_connections_per_endpoint: Some(4),
                ping_interval: Some(Duration::from_secs(2)),
                ping_timeout: Some(Duration::from_secs(1)),
            }
        );
    }
}
