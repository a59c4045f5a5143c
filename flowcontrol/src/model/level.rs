//! PriorityLevelConfigurations read with kube's v1 defaults and validated as kube validates them.

use std::sync::Arc;

use k8s_openapi::api::flowcontrol::v1 as api;

use super::{invalid, Invalid};
use crate::bootstrap::{self, CATCH_ALL, EXEMPT};
use crate::fairqueuing::shuffle_shard::Dealer;

const DEFAULT_NOMINAL_SHARES: i32 = 30;
const DEFAULT_QUEUES: i32 = 64;
const DEFAULT_HAND_SIZE: i32 = 8;
const DEFAULT_QUEUE_LENGTH_LIMIT: i32 = 50;
/// kube allows 10⁷ queues per level; the gateway allocates its queues up front and keeps each
/// level within a few MiB.
pub const MAX_QUEUES: i32 = 1 << 16;

/// A PriorityLevelConfiguration as the gateway uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LevelSpec {
    pub name: Arc<str>,
    /// What the API assigned (built-in objects get one derived from their name).
    pub uid: Arc<str>,
    pub nominal_shares: u32,
    pub lendable_percent: u32,
    /// `None`: may borrow up to the server's whole concurrency limit.
    pub borrowing_limit_percent: Option<u32>,
    pub limit_response: LimitResponse,
}

/// What a level does with a request over its seats: kube's `limitResponse` (queue or reject),
/// with its `Exempt` level type as a third answer. Not to be confused with the seats
/// themselves (`concurrency_limit`), which the controller sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitResponse {
    /// Never limited (the `exempt` level).
    Exempt,
    /// Over its limit, a request is refused at once.
    Reject,
    /// Over its limit, a request waits in one of `queues` queues (chosen by shuffle sharding a
    /// hand of `hand_size`), refused only when that queue holds `queue_length_limit`.
    Queue(Queuing),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queuing {
    pub queues: u32,
    pub hand_size: u32,
    pub queue_length_limit: u32,
}

impl Queuing {
    pub fn dealer(&self) -> Dealer {
        Dealer::new(i64::from(self.queues), i64::from(self.hand_size))
            .expect("queuing validated with the dealer's own checks")
    }
}

impl LevelSpec {
    pub fn is_exempt(&self) -> bool {
        self.limit_response == LimitResponse::Exempt
    }

    /// Reads and validates a PriorityLevelConfiguration.
    pub fn from_api(pl: &api::PriorityLevelConfiguration) -> Result<Self, Invalid> {
        let name = pl.metadata.name.as_deref().unwrap_or_default();
        if name.is_empty() {
            return invalid("metadata.name is required");
        }
        let spec = &pl.spec;
        let spec = match name {
            EXEMPT => mandatory_exempt_spec(spec)?,
            CATCH_ALL => mandatory_spec(spec, &bootstrap::mandatory_priority_levels()[1])?,
            _ => spec.clone(),
        };
        let exempt_type = spec.type_ == "Exempt";
        if (name == EXEMPT) != exempt_type {
            return invalid("spec.type must be 'Exempt' if and only if the name is 'exempt'");
        }
        let (shares, lendable, borrowing, limit_response) = match spec.type_.as_str() {
            "Exempt" => {
                if spec.limited.is_some() {
                    return invalid("spec.limited must be unset when spec.type is 'Exempt'");
                }
                let Some(e) = &spec.exempt else {
                    return invalid("spec.exempt is required when spec.type is 'Exempt'");
                };
                (
                    e.nominal_concurrency_shares.unwrap_or(0),
                    e.lendable_percent.unwrap_or(0),
                    None,
                    LimitResponse::Exempt,
                )
            }
            "Limited" => {
                if spec.exempt.is_some() {
                    return invalid("spec.exempt must be unset when spec.type is 'Limited'");
                }
                let Some(l) = &spec.limited else {
                    return invalid("spec.limited is required when spec.type is 'Limited'");
                };
                (
                    l.nominal_concurrency_shares
                        .unwrap_or(DEFAULT_NOMINAL_SHARES),
                    l.lendable_percent.unwrap_or(0),
                    l.borrowing_limit_percent,
                    limit_response(&l.limit_response)?,
                )
            }
            other => {
                return invalid(format!(
                    "spec.type {other:?}: must be 'Exempt' or 'Limited'"
                ))
            }
        };
        if shares < 0 {
            return invalid(format!(
                "nominalConcurrencyShares {shares}: must be a non-negative integer"
            ));
        }
        if !(0..=100).contains(&lendable) {
            return invalid(format!(
                "lendablePercent {lendable}: must be between 0 and 100, inclusive"
            ));
        }
        if let Some(b) = borrowing.filter(|b| *b < 0) {
            return invalid(format!(
                "borrowingLimitPercent {b}: if specified, must be a non-negative integer"
            ));
        }
        Ok(Self {
            name: name.into(),
            uid: pl.metadata.uid.as_deref().unwrap_or_default().into(),
            nominal_shares: shares as u32,
            lendable_percent: lendable as u32,
            borrowing_limit_percent: borrowing.map(|b| b as u32),
            limit_response,
        })
    }
}

fn limit_response(lr: &api::LimitResponse) -> Result<LimitResponse, Invalid> {
    match lr.type_.as_str() {
        "Reject" => {
            if lr.queuing.is_some() {
                return invalid("limitResponse.queuing must be unset when its type is 'Reject'");
            }
            Ok(LimitResponse::Reject)
        }
        "Queue" => {
            let Some(q) = &lr.queuing else {
                return invalid("limitResponse.queuing is required when its type is 'Queue'");
            };
            let default = |v: Option<i32>, d| v.filter(|v| *v != 0).unwrap_or(d);
            let queues = default(q.queues, DEFAULT_QUEUES);
            let hand_size = default(q.hand_size, DEFAULT_HAND_SIZE);
            let queue_length_limit = default(q.queue_length_limit, DEFAULT_QUEUE_LENGTH_LIMIT);
            if queue_length_limit <= 0 {
                return invalid(format!(
                    "queuing.queueLengthLimit {queue_length_limit}: must be positive"
                ));
            }
            if queues > MAX_QUEUES {
                return invalid(format!(
                    "queuing.queues {queues}: the gateway supports at most {MAX_QUEUES} queues per priority level"
                ));
            }
            Dealer::new(i64::from(queues), i64::from(hand_size))
                .map_err(|e| Invalid(format!("queuing: {e}")))?;
            Ok(LimitResponse::Queue(Queuing {
                queues: queues as u32,
                hand_size: hand_size as u32,
                queue_length_limit: queue_length_limit as u32,
            }))
        }
        other => invalid(format!(
            "limitResponse.type {other:?}: must be 'Queue' or 'Reject'"
        )),
    }
}

/// `exempt` may change only `spec.exempt`.
fn mandatory_exempt_spec(
    spec: &api::PriorityLevelConfigurationSpec,
) -> Result<api::PriorityLevelConfigurationSpec, Invalid> {
    let fixed = bootstrap::mandatory_priority_levels()[0].spec.clone();
    let mut have = spec.clone();
    have.exempt = fixed.exempt.clone();
    if have != fixed {
        return invalid(
            "spec of 'exempt' except its 'spec.exempt' field must equal the fixed value",
        );
    }
    Ok(spec.clone())
}

fn mandatory_spec(
    spec: &api::PriorityLevelConfigurationSpec,
    fixed: &api::PriorityLevelConfiguration,
) -> Result<api::PriorityLevelConfigurationSpec, Invalid> {
    let name = fixed.metadata.name.as_deref().unwrap_or_default();
    if *spec != fixed.spec {
        return invalid(format!("spec of '{name}' must equal the fixed value"));
    }
    Ok(spec.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(json: serde_json::Value) -> Result<LevelSpec, Invalid> {
        LevelSpec::from_api(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn kube_defaults_fill_what_a_core_left_out() {
        let pl = level(serde_json::json!({
            "metadata": {"name": "team", "uid": "u-1"},
            "spec": {"type": "Limited", "limited": {"limitResponse": {"type": "Queue", "queuing": {}}}}
        }))
        .unwrap();
        assert_eq!(pl.nominal_shares, 30);
        assert_eq!(pl.lendable_percent, 0);
        assert_eq!(pl.borrowing_limit_percent, None);
        assert_eq!(
            pl.limit_response,
            LimitResponse::Queue(Queuing {
                queues: 64,
                hand_size: 8,
                queue_length_limit: 50
            })
        );
        assert_eq!(&*pl.uid, "u-1");
    }

    #[test]
    fn what_kube_validation_refuses_is_ignored_with_its_reason() {
        let cases = [
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"type": "Limited"}}),
                "spec.limited is required",
            ),
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"type": "Exempt", "exempt": {}}}),
                "'Exempt' if and only if",
            ),
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"type": "Limited", "limited": {
                    "lendablePercent": 101, "limitResponse": {"type": "Reject"}}}}),
                "lendablePercent 101",
            ),
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"type": "Limited", "limited": {
                    "limitResponse": {"type": "Queue", "queuing": {"queues": 4, "handSize": 5}}}}}),
                "handSize 5 is greater than deckSize 4",
            ),
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"type": "Limited", "limited": {
                    "limitResponse": {"type": "Queue", "queuing": {"queues": 512, "handSize": 8}}}}}),
                "required entropy bits",
            ),
            (
                serde_json::json!({"metadata": {"name": "x"}, "spec": {"type": "Limited", "limited": {
                    "limitResponse": {"type": "Reject", "queuing": {}}}}}),
                "must be unset",
            ),
            (
                serde_json::json!({"metadata": {"name": "catch-all"}, "spec": {"type": "Limited", "limited": {
                    "nominalConcurrencyShares": 500, "limitResponse": {"type": "Reject"}}}}),
                "must equal the fixed value",
            ),
        ];
        for (json, want) in cases {
            let err = level(json.clone()).unwrap_err().to_string();
            assert!(err.contains(want), "{json}: {err}");
        }
        // exempt may change its own shares, nothing else.
        let pl = level(
            serde_json::json!({"metadata": {"name": "exempt"}, "spec": {"type": "Exempt",
            "exempt": {"nominalConcurrencyShares": 10, "lendablePercent": 50}}}),
        )
        .unwrap();
        assert_eq!((pl.nominal_shares, pl.lendable_percent), (10, 50));
    }
}
