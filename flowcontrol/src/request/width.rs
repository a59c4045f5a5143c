//! How many seats a request takes (k8s.io/apiserver `pkg/util/flowcontrol/request/width.go`,
//! `list_work_estimator.go`, `mutating_work_estimator.go`).
//!
//! * Most requests: one seat.
//! * A LIST: one seat per 100 kB it makes the server hold (kube's size-based estimate, on by
//!   default since 1.34), at most the level's share of wide seats; one for a LIST of a single
//!   object. kube multiplies its stored object count by the average object size; the gateway
//!   has neither and uses the size of the answers it relayed to the same LIST
//!   (`list_sizes.rs`), one seat until it has seen one. A LIST kube serves from its watch
//!   cache (`resourceVersion=0`) holds at most 1 MB at a time, so at most 10 seats.
//! * A WATCH: one seat while it starts, or its LIST's seats when it begins by sending the
//!   current state (`sendInitialEvents=true`, or the legacy `resourceVersion` unset or `0`),
//!   as served from the cache.
//! * A write: one seat, and if ten or more watches relayed by the gateway cover the object,
//!   extra final seats (one per ten watches, 5 ms each, reshaped to at most the level's wide
//!   seats) for the events it causes.

use std::sync::Arc;
use std::time::Duration;

use gateway_request::request_info::{query_value, RequestInfo};

use crate::request::list_sizes::{ListKey, ListSizes};
use crate::request::seats::{SeatSeconds, WorkEstimate};
use crate::request::watch_tracker::WatchTracker;

const MINIMUM_SEATS: u32 = 1;
const MAXIMUM_LIST_SEATS: u32 = 100;
const MAXIMUM_MUTATING_SEATS: u32 = 10;
const BYTES_PER_SEAT: u64 = 100_000;
/// What a LIST from kube's watch cache holds at once, at most.
const CACHE_MAX_BYTES: u64 = 1_000_000;
const WATCHES_PER_SEAT: u32 = 10;
const EVENT_ADDITIONAL_DURATION: Duration = Duration::from_millis(5);

/// The estimate, and where to record the LIST's answer once its size is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub work: WorkEstimate,
    /// For a LIST: its key, to record the size of its answer with [`Estimator::record_list`].
    pub list: Option<ListKey>,
    /// For a write: the watches it may wake (kube's `watch_count_samples`).
    pub watch_count: Option<u32>,
}

#[derive(Default)]
pub struct Estimator {
    lists: ListSizes,
    watches: Arc<WatchTracker>,
}

impl Estimator {
    pub fn watches(&self) -> &Arc<WatchTracker> {
        &self.watches
    }

    /// The size of a LIST's answer, for the next estimate of the same LIST.
    pub fn record_list(&self, key: ListKey, bytes: u64) {
        self.lists.record(key, bytes);
    }

    /// The work of `info` (with its raw `query`) at a level allowing `level_max_seats` seats to
    /// one request (0: no level limit).
    pub fn estimate(&self, info: &RequestInfo, query: &str, level_max_seats: u32) -> Estimate {
        let seats = |n| Estimate {
            work: WorkEstimate::seats(n),
            list: None,
            watch_count: None,
        };
        match info.verb() {
            "list" => self.list(info, query, level_max_seats),
            "watch" => {
                let initial_events = query_value(query, "sendInitialEvents")
                    .is_some_and(|v| v.eq_ignore_ascii_case(b"true") || *v == *b"1");
                let rv = query_value(query, "resourceVersion");
                let legacy = rv.as_deref().is_none_or(|v| v.is_empty() || v == b"0");
                if !initial_events && !legacy {
                    return seats(MINIMUM_SEATS);
                }
                let key = ListKey::new(info.api_group(), info.resource(), info.namespace(), b"");
                let limit = max_seats(level_max_seats, MAXIMUM_LIST_SEATS);
                seats(self.list_seats(key, true, info, limit))
            }
            "create" | "update" | "patch" | "delete" => self.mutating(info, level_max_seats),
            _ => seats(MINIMUM_SEATS),
        }
    }

    fn list(&self, info: &RequestInfo, query: &str, level_max_seats: u32) -> Estimate {
        let limit = query_value(query, "limit").unwrap_or_default();
        let key = ListKey::new(info.api_group(), info.resource(), info.namespace(), &limit);
        let rv = query_value(query, "resourceVersion");
        let from_cache = rv.as_deref() == Some(b"0");
        let max = max_seats(level_max_seats, MAXIMUM_LIST_SEATS);
        Estimate {
            work: WorkEstimate::seats(self.list_seats(key, from_cache, info, max)),
            list: Some(key),
            watch_count: None,
        }
    }

    fn list_seats(&self, key: ListKey, from_cache: bool, info: &RequestInfo, max: u32) -> u32 {
        if !info.name().is_empty() {
            return MINIMUM_SEATS;
        }
        let Some(mut bytes) = self.lists.get(key) else {
            return MINIMUM_SEATS;
        };
        if from_cache {
            bytes = bytes.min(CACHE_MAX_BYTES);
        }
        let seats = bytes.div_ceil(BYTES_PER_SEAT).min(u64::from(u32::MAX)) as u32;
        seats.clamp(MINIMUM_SEATS, max.max(MINIMUM_SEATS))
    }

    fn mutating(&self, info: &RequestInfo, level_max_seats: u32) -> Estimate {
        let mut e = Estimate {
            work: WorkEstimate::seats(MINIMUM_SEATS),
            list: None,
            watch_count: None,
        };
        // A ServiceAccount token request writes nothing anyone watches.
        if info.resource() == "serviceaccounts" && info.subresource() == "token" {
            return e;
        }
        let watches = self.watches.interested(info);
        e.watch_count = Some(watches);
        if watches >= WATCHES_PER_SEAT {
            let full = watches.div_ceil(WATCHES_PER_SEAT);
            let work = SeatSeconds::seats_times(f64::from(full), EVENT_ADDITIONAL_DURATION);
            let seats = full.min(max_seats(level_max_seats, MAXIMUM_MUTATING_SEATS));
            e.work.final_seats = seats;
            e.work.additional_latency = work.duration_per_seat(f64::from(seats));
        }
        e
    }
}

/// The level's limit on one request's seats, within the estimator's own.
fn max_seats(level: u32, estimator: u32) -> u32 {
    if level == 0 || level > estimator {
        estimator
    } else {
        level
    }
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use gateway_request::request_info::parse;

    fn estimate(e: &Estimator, method: Method, target: &str, level_max: u32) -> Estimate {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        e.estimate(&parse(&method, path, query).unwrap(), query, level_max)
    }

    /// The initial seats of `GET target`.
    fn list_seats(e: &Estimator, target: &str, level_max: u32) -> u32 {
        estimate(e, Method::GET, target, level_max)
            .work
            .initial_seats
    }

    #[test]
    fn lists_take_seats_for_the_bytes_their_answers_held() {
        let e = Estimator::default();
        let list = "/api/v1/namespaces/x/configmaps";
        // Nothing seen yet: one seat.
        let first = estimate(&e, Method::GET, list, 8);
        assert_eq!(first.work, WorkEstimate::seats(1));
        let key = first.list.unwrap();
        e.record_list(key, 750_000);
        assert_eq!(list_seats(&e, list, 8), 8);
        assert_eq!(list_seats(&e, list, 0), 8);
        assert_eq!(list_seats(&e, list, 4), 4);
        e.record_list(key, 5_000_000);
        e.record_list(key, 5_000_000);
        assert_eq!(list_seats(&e, list, 0), 40);
        // From the watch cache at most 1 MB is held at once.
        assert_eq!(list_seats(&e, &format!("{list}?resourceVersion=0"), 0), 10);
        // Another page size, another namespace, a single object: not this answer.
        for other in [
            format!("{list}?limit=500"),
            "/api/v1/namespaces/y/configmaps".to_owned(),
            format!("{list}?fieldSelector=metadata.name%3Dc"),
        ] {
            assert_eq!(list_seats(&e, &other, 0), 1, "{other}");
        }
        // A watch that starts with the current state costs that state, as from the cache.
        assert_eq!(list_seats(&e, &format!("{list}?watch=1"), 0), 10);
        assert_eq!(
            list_seats(
                &e,
                &format!("{list}?watch=1&resourceVersion=42&sendInitialEvents=true"),
                0
            ),
            10
        );
        assert_eq!(
            estimate(
                &e,
                Method::GET,
                &format!("{list}?watch=1&resourceVersion=42"),
                0
            )
            .work,
            WorkEstimate::seats(1)
        );
    }

    #[test]
    fn writes_watched_by_many_hold_final_seats_for_their_events() {
        let e = Estimator::default();
        let cm = "/api/v1/namespaces/x/configmaps/c";
        assert_eq!(
            estimate(&e, Method::PUT, cm, 0).work,
            WorkEstimate::seats(1)
        );
        let (path, query) = ("/api/v1/namespaces/x/configmaps", "watch=1");
        let info = parse(&Method::GET, path, query).unwrap();
        let watches: Vec<_> = (0..35)
            .map(|_| e.watches().register(&info, query).unwrap())
            .collect();
        let w = estimate(&e, Method::PUT, cm, 0);
        assert_eq!(w.watch_count, Some(35));
        assert_eq!(w.work.initial_seats, 1);
        assert_eq!(w.work.final_seats, 4);
        assert_eq!(w.work.additional_latency, Duration::from_millis(5));
        // Narrowed to the level's wide seats, lengthened to keep the work.
        let narrow = estimate(&e, Method::PUT, cm, 2).work;
        assert_eq!(narrow.final_seats, 2);
        assert_eq!(narrow.additional_latency, Duration::from_millis(10));
        assert_eq!(
            estimate(
                &e,
                Method::POST,
                "/api/v1/namespaces/x/serviceaccounts/s/token",
                0
            )
            .work,
            WorkEstimate::seats(1)
        );
        drop(watches);
        assert_eq!(
            estimate(&e, Method::PUT, cm, 0).work,
            WorkEstimate::seats(1)
        );
    }
}
