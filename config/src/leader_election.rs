//! `--leader-elect-*`: which replica writes APIService status. Validated with client-go's rules
//! (`leaderelection.NewLeaderElector`), which are what make "never two writers" hold: the leader
//! gives up after the renew deadline, before the lease duration after which another replica may
//! take over, and retries often enough to renew within that deadline.

use std::time::Duration;

use crate::config::{ApiServiceSource, LeaderElection};
use crate::error::ConfigError;
use crate::GoDuration;

/// client-go's `JitterFactor`: a retry waits up to 1.2 retry periods.
const JITTER: f64 = 1.2;

pub(crate) const DEFAULT_NAME: &str = "aggregation-gateway";
/// Where kube's control-plane components keep their leases.
pub(crate) const DEFAULT_NAMESPACE: &str = "kube-system";

/// The `--leader-elect*` options, taken out of [`crate::Options`] by validation.
pub(crate) struct LeaderElectOptions {
    pub leader_elect: Option<bool>,
    pub lease_duration: Option<GoDuration>,
    pub renew_deadline: Option<GoDuration>,
    pub retry_period: Option<GoDuration>,
    pub name: Option<String>,
    pub namespace: Option<String>,
}

/// The election the options ask for, if any. Only the kube source writes status, so that is
/// where it is on by default; asked for with another source it is refused rather than ignored.
pub(crate) fn leader_election(
    options: LeaderElectOptions,
    source: &ApiServiceSource,
) -> Result<Option<LeaderElection>, ConfigError> {
    let kube = matches!(source, ApiServiceSource::Kube { .. });
    match options.leader_elect {
        Some(true) if !kube => {
            return Err(ConfigError::new(
                "leader-elect",
                "only applies to --apiservice-source=kube, the one source whose status the \
                 gateway writes to the core; remove it or set it to false",
            ))
        }
        Some(false) => return Ok(None),
        None if !kube => return Ok(None),
        _ => {}
    }
    let duration = |flag: &str, value: Option<GoDuration>, default: u64| {
        let d = value.map_or(Duration::from_secs(default), |d| d.0);
        if d.is_zero() {
            return Err(ConfigError::new(flag, "must be greater than 0s"));
        }
        Ok(d)
    };
    let lease_duration = duration("leader-elect-lease-duration", options.lease_duration, 15)?;
    let renew_deadline = duration("leader-elect-renew-deadline", options.renew_deadline, 10)?;
    let retry_period = duration("leader-elect-retry-period", options.retry_period, 2)?;
    if lease_duration <= renew_deadline {
        return Err(ConfigError::new(
            "leader-elect-lease-duration",
            format!(
                "{lease_duration:?} must be longer than --leader-elect-renew-deadline \
                 ({renew_deadline:?}): the leader must stop writing before another replica may \
                 take over"
            ),
        ));
    }
    if renew_deadline.as_secs_f64() <= retry_period.as_secs_f64() * JITTER {
        return Err(ConfigError::new(
            "leader-elect-renew-deadline",
            format!(
                "{renew_deadline:?} must be longer than 1.2 x --leader-elect-retry-period \
                 ({retry_period:?}), so that the leader can retry a failed renewal in time"
            ),
        ));
    }
    // The Lease stores whole seconds.
    if lease_duration < Duration::from_secs(1) {
        return Err(ConfigError::new(
            "leader-elect-lease-duration",
            "must be at least 1s (a Lease stores whole seconds)",
        ));
    }
    let name = options.name.unwrap_or_else(|| DEFAULT_NAME.to_owned());
    check_name(&name, 253, true)
        .map_err(|m| ConfigError::new("leader-elect-resource-name", format!("{name:?}: {m}")))?;
    let namespace = options
        .namespace
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    check_name(&namespace, 63, false).map_err(|m| {
        ConfigError::new(
            "leader-elect-resource-namespace",
            format!("{namespace:?}: {m}"),
        )
    })?;
    Ok(Some(LeaderElection {
        lease_duration,
        renew_deadline,
        retry_period,
        name,
        namespace,
    }))
}

/// A DNS-1123 subdomain (`dots`, object names) or label (namespaces), as kube validates them.
fn check_name(name: &str, max: usize, dots: bool) -> Result<(), String> {
    let what = if dots {
        "a Lease name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    } else {
        "a namespace: lowercase letters, digits and '-', starting and ending with a letter or digit"
    };
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let body_ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.'));
    if name.is_empty() || name.len() > max {
        return Err(format!("must be 1 to {max} characters, {what}"));
    }
    if !body_ok || !edge_ok(name.chars().next()) || !edge_ok(name.chars().last()) {
        return Err(format!("is not {what}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    fn validated(yaml: &str) -> Result<crate::Config, ConfigError> {
        serde_saphyr::from_str::<Options>(yaml).unwrap().validate()
    }

    #[test]
    fn on_by_default_with_the_kube_source_only() {
        let c = validated("").unwrap();
        assert_eq!(
            c.leader_election,
            Some(LeaderElection {
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
                name: "aggregation-gateway".into(),
                namespace: "kube-system".into(),
            })
        );
        assert_eq!(
            validated("leaderElect: false\n").unwrap().leader_election,
            None
        );
        assert_eq!(
            validated("apiserviceSource: none\n")
                .unwrap()
                .leader_election,
            None
        );
    }

    #[test]
    fn flags_set_the_lease() {
        let c = validated(
            "leaderElectLeaseDuration: 3s\nleaderElectRenewDeadline: 2s\n\
             leaderElectRetryPeriod: 250ms\nleaderElectResourceName: edge.gateway\n\
             leaderElectResourceNamespace: edge\n",
        )
        .unwrap();
        let le = c.leader_election.unwrap();
        assert_eq!(le.lease_duration, Duration::from_secs(3));
        assert_eq!(le.renew_deadline, Duration::from_secs(2));
        assert_eq!(le.retry_period, Duration::from_millis(250));
        assert_eq!(
            (le.name.as_str(), le.namespace.as_str()),
            ("edge.gateway", "edge")
        );
    }

    /// One row per refusal: the whole line, naming the flag and its YAML key.
    #[test]
    fn refusals_name_the_flag() {
        for (yaml, want) in [
            (
                "apiserviceSource: none\nleaderElect: true\n",
                "invalid configuration: --leader-elect (leaderElect): only applies to \
                 --apiservice-source=kube, the one source whose status the gateway writes to the \
                 core; remove it or set it to false",
            ),
            (
                "leaderElectLeaseDuration: 10s\n",
                "invalid configuration: --leader-elect-lease-duration (leaderElectLeaseDuration): \
                 10s must be longer than --leader-elect-renew-deadline (10s): the leader must \
                 stop writing before another replica may take over",
            ),
            (
                "leaderElectRetryPeriod: 9s\n",
                "invalid configuration: --leader-elect-renew-deadline (leaderElectRenewDeadline): \
                 10s must be longer than 1.2 x --leader-elect-retry-period (9s), so that the \
                 leader can retry a failed renewal in time",
            ),
            (
                "leaderElectRetryPeriod: 0s\n",
                "invalid configuration: --leader-elect-retry-period (leaderElectRetryPeriod): \
                 must be greater than 0s",
            ),
            (
                "leaderElectLeaseDuration: 900ms\nleaderElectRenewDeadline: 800ms\n\
                 leaderElectRetryPeriod: 100ms\n",
                "invalid configuration: --leader-elect-lease-duration (leaderElectLeaseDuration): \
                 must be at least 1s (a Lease stores whole seconds)",
            ),
            (
                "leaderElectResourceName: Gateway\n",
                "invalid configuration: --leader-elect-resource-name (leaderElectResourceName): \
                 \"Gateway\": is not a Lease name: lowercase letters, digits, '-' and '.', \
                 starting and ending with a letter or digit",
            ),
            (
                "leaderElectResourceNamespace: a.b\n",
                "invalid configuration: --leader-elect-resource-namespace \
                 (leaderElectResourceNamespace): \"a.b\": is not a namespace: lowercase letters, \
                 digits and '-', starting and ending with a letter or digit",
            ),
            (
                "leaderElectResourceNamespace: \"\"\n",
                "invalid configuration: --leader-elect-resource-namespace \
                 (leaderElectResourceNamespace): \"\": must be 1 to 63 characters, a namespace: \
                 lowercase letters, digits and '-', starting and ending with a letter or digit",
            ),
        ] {
            let err = validated(yaml).unwrap_err();
            assert_eq!(err.to_string(), want, "{yaml}");
        }
    }

    #[test]
    fn the_reachability_check_is_opt_in() {
        assert!(!validated("").unwrap().apiservices.readyz_reachable);
        let cli = <crate::Cli as clap::Parser>::try_parse_from([
            "gw",
            "--readyz-aggregated-apiservice-reachable",
        ])
        .unwrap();
        assert!(cli.options.validate().unwrap().apiservices.readyz_reachable);
    }
}
