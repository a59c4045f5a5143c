//! APIServices from the core server: a kube-rs watcher feeding a reflector store, published as a
//! complete set after every change, and the `status` writer the availability controller uses.
//!
//! The reflector is what keeps consumers from ever seeing a partial or empty list: on a relist
//! (410 Gone, core restart, watch timeout) it buffers `InitApply` objects and swaps them in
//! atomically at `InitDone`, so the store holds the previous complete state until the new one is
//! complete. We publish only at `InitDone` and on later `Apply`/`Delete` events, never at `Init`.

use std::future::Future;
use std::sync::Arc;

use ::kube::api::{Api, Patch, PatchParams};
use ::kube::runtime::reflector::{self, Store};
use ::kube::runtime::{watcher, WatchStreamExt};
use ::kube::{Client, ResourceExt};

use futures::{Stream, StreamExt};
use tracing::{debug, info, Instrument};

use super::{publish, sort_by_name, ApiServiceSet, SetSender, SourceError};
use crate::model::{set_condition, APIService, APIServiceCondition};
use crate::outage::Outage;

/// Who the gateway's status writes are recorded as in `metadata.managedFields`, as
/// kube-apiserver's own availability controller's are recorded as `kube-apiserver`: an operator
/// reading an APIService sees which of the two wrote its condition.
pub const FIELD_MANAGER: &str = "aggregation-gateway";

/// How often a conflicting status write (someone else changed the object in between) is retried
/// with a fresh read before giving up; the availability controller re-checks soon anyway.
const STATUS_WRITE_ATTEMPTS: usize = 3;

/// Watches APIServices (optionally only those matching `label_selector`) and publishes the full,
/// name-sorted set on `tx` after the first complete list and after every later change.
///
/// Runs until every receiver of `tx` is gone. Watch errors (core down, RBAC) are retried with
/// kube-rs' default exponential backoff and logged once per outage ([`Outage`]); the last
/// published set stays in force meanwhile.
///
/// The future runs in an `apiservice_source` span naming the source and the label selector,
/// wherever it is spawned, so its log lines need not repeat them.
pub fn run(
    client: Client,
    label_selector: Option<String>,
    tx: SetSender,
) -> impl Future<Output = ()> + Send + 'static {
    let span = tracing::info_span!(
        "apiservice_source",
        source = "kube",
        // Absent without a selector (every APIService is watched).
        label_selector = label_selector.as_deref()
    );
    let outage = Arc::new(Outage::new(
        "APIService watch",
        "the last known APIServices stay in force",
    ));
    let api = Api::<APIService>::all(outage.client(client));
    let mut config = watcher::Config::default();
    if let Some(selector) = label_selector.as_deref() {
        config = config.labels(selector);
    }
    let events = watcher(api, config)
        .default_backoff()
        // managedFields can be several times the size of the object and nothing reads them.
        .modify(|api: &mut APIService| api.managed_fields_mut().clear());
    drive(events, outage, tx).instrument(span)
}

/// The source's loop over watcher events, separate from the watcher so tests can feed it a
/// scripted stream (relists, errors) without a server.
async fn drive<S>(events: S, outage: Arc<Outage>, tx: SetSender)
where
    S: Stream<Item = Result<watcher::Event<APIService>, watcher::Error>> + Send,
{
    let (store, writer) = reflector::store::<APIService>();
    let mut events = std::pin::pin!(events.reflect(writer));
    let mut synced = false;

    loop {
        let event = tokio::select! {
            event = events.next() => event,
            // Nobody listens any more (shutdown): stop watching.
            () = tx.closed() => return,
        };
        let Some(event) = event else { return };
        outage.watch_event(&event);
        match event {
            Ok(watcher::Event::Init) => debug!("APIService watch (re)listing"),
            // Mid-relist: the store keeps the previous complete state until InitDone.
            Ok(watcher::Event::InitApply(_)) => {}
            Ok(watcher::Event::InitDone) => {
                if !synced {
                    info!(count = store.len(), "APIService watch synced");
                }
                synced = true;
                publish_store(&store, &tx);
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                if synced {
                    publish_store(&store, &tx);
                }
            }
            // Logged by `outage`.
            Err(_) => {}
        }
    }
}

fn publish_store(store: &Store<APIService>, tx: &SetSender) {
    let mut items: Vec<APIService> = store.state().iter().map(|a| (**a).clone()).collect();
    sort_by_name(&mut items);
    let count = items.len();
    // The API server validated every object; nothing here is refused.
    if publish(tx, ApiServiceSet::accepted(items)) {
        debug!(count, "published APIServices from the core server");
    }
}

/// Sets the `Available` condition of APIService `name` in the core server, the way
/// kube-aggregator's availability controller does: reads the object, and writes the `status`
/// subresource only if the condition's status, reason or message changed (no-op writes are
/// skipped because the controller re-checks every APIService often). `lastTransitionTime` moves
/// only when the status changes.
///
/// The write is a JSON merge patch carrying the `resourceVersion` read, so it cannot silently
/// overwrite a concurrent status change; on such a conflict it re-reads and retries a few times.
pub async fn write_available_condition(
    client: &Client,
    name: &str,
    condition: APIServiceCondition,
) -> Result<(), SourceError> {
    let api = Api::<APIService>::all(client.clone());
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = api
            .get_status(name)
            .await
            .map_err(|source| SourceError::Kube {
                action: "reading",
                name: name.to_owned(),
                source,
            })?;
        let Some(patch) = available_condition_patch(&current, condition.clone()) else {
            return Ok(());
        };
        match api
            .patch_status(name, &status_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                debug!(apiservice = name, "wrote Available condition");
                return Ok(());
            }
            Err(::kube::Error::Api(status))
                if status.is_conflict() && attempt < STATUS_WRITE_ATTEMPTS =>
            {
                debug!(
                    apiservice = name,
                    attempt, "status write conflicted; re-reading"
                );
            }
            Err(source) => {
                return Err(SourceError::Kube {
                    action: "writing status of",
                    name: name.to_owned(),
                    source,
                })
            }
        }
    }
}

/// Every status write names [`FIELD_MANAGER`].
fn status_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// The merge patch that sets `condition` on `current`, or `None` when nothing would change.
///
/// Pure (no I/O) so the "no write when unchanged" rule is unit-tested. The patch replaces the
/// whole `status.conditions` list (JSON merge patch replaces arrays), keeping any other
/// condition types as read, and pins `metadata.resourceVersion` for optimistic concurrency.
pub fn available_condition_patch(
    current: &APIService,
    condition: APIServiceCondition,
) -> Option<serde_json::Value> {
    let mut next = current.clone();
    if !set_condition(&mut next, condition) {
        return None;
    }
    let conditions = next
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut patch = serde_json::json!({ "status": { "conditions": conditions } });
    if let Some(rv) = current.metadata.resource_version.as_deref() {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{available, APIServiceStatus, ConditionStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use std::sync::Arc;
    use tokio::sync::watch;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn with_conditions(conditions: Vec<APIServiceCondition>) -> APIService {
        APIService {
            metadata: ObjectMeta {
                name: Some("v1.a.io".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(APIServiceStatus {
                conditions: Some(conditions),
            }),
        }
    }

    fn named(name: &str) -> APIService {
        APIService {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(set: &Option<Arc<ApiServiceSet>>) -> Option<Vec<String>> {
        set.as_ref()
            .map(|s| s.apiservices.iter().map(|a| a.name_any()).collect())
    }

    /// Relists (core restart, 410 Gone) and errors never publish a partial or empty set: the
    /// previous complete set stays until the new list is complete.
    #[tokio::test]
    async fn relists_publish_only_complete_sets() {
        use watcher::Event::*;
        let (events_tx, events) = futures::channel::mpsc::unbounded();
        let (tx, mut rx) = super::super::channel();
        let outage = Arc::new(Outage::new("APIService watch", "nothing changes"));
        let task = tokio::spawn(drive(events, outage, tx));
        let send = |e| events_tx.unbounded_send(e).unwrap();
        let quiet = |rx: &mut watch::Receiver<_>| {
            let mut rx = rx.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_millis(100), rx.changed())
                    .await
                    .is_err()
            }
        };

        send(Ok(Init));
        send(Ok(InitApply(named("v1.b.io"))));
        send(Ok(InitApply(named("v1.a.io"))));
        assert!(quiet(&mut rx).await, "nothing before InitDone");
        assert_eq!(names(&rx.borrow()), None);

        send(Ok(InitDone));
        rx.changed().await.unwrap();
        assert_eq!(
            names(&rx.borrow_and_update()),
            Some(vec!["v1.a.io".into(), "v1.b.io".into()])
        );

        send(Ok(Apply(named("v1.c.io"))));
        rx.changed().await.unwrap();
        assert_eq!(names(&rx.borrow_and_update()).unwrap().len(), 3);

        // The core restarts: errors, then a relist that drops v1.a.io.
        send(Err(watcher::Error::NoResourceVersion));
        send(Ok(Init));
        send(Ok(InitApply(named("v1.c.io"))));
        send(Ok(InitApply(named("v1.b.io"))));
        assert!(quiet(&mut rx).await, "nothing published mid-relist");
        assert_eq!(names(&rx.borrow()).unwrap().len(), 3);
        send(Ok(InitDone));
        rx.changed().await.unwrap();
        assert_eq!(
            names(&rx.borrow_and_update()),
            Some(vec!["v1.b.io".into(), "v1.c.io".into()])
        );

        // A relist that changes nothing publishes nothing new.
        send(Ok(Init));
        send(Ok(InitApply(named("v1.b.io"))));
        send(Ok(InitApply(named("v1.c.io"))));
        send(Ok(InitDone));
        assert!(quiet(&mut rx).await);

        send(Ok(Delete(named("v1.b.io"))));
        rx.changed().await.unwrap();
        assert_eq!(names(&rx.borrow_and_update()), Some(vec!["v1.c.io".into()]));

        drop(rx);
        tokio::time::timeout(std::time::Duration::from_secs(2), task)
            .await
            .expect("stops when nobody listens")
            .unwrap();
    }

    #[test]
    fn unchanged_condition_means_no_write() {
        let current = with_conditions(vec![available(
            ConditionStatus::True,
            "Passed",
            "all checks passed",
            t(1),
        )]);
        // Same status, reason and message; only the probe time differs.
        let again = available(ConditionStatus::True, "Passed", "all checks passed", t(99));
        assert_eq!(available_condition_patch(&current, again), None);
    }

    #[test]
    fn changed_message_keeps_transition_time() {
        let current = with_conditions(vec![available(
            ConditionStatus::False,
            "ServiceNotFound",
            "old",
            t(1),
        )]);
        let next = available(ConditionStatus::False, "MissingEndpoints", "new", t(5));
        let patch = available_condition_patch(&current, next).expect("a write");
        let c = &patch["status"]["conditions"][0];
        assert_eq!(c["reason"], "MissingEndpoints");
        assert_eq!(c["message"], "new");
        assert_eq!(c["lastTransitionTime"], serde_json::to_value(t(1)).unwrap());
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
    }

    #[test]
    fn status_flip_moves_transition_time_and_keeps_other_conditions() {
        let other = APIServiceCondition {
            type_: "Other".into(),
            status: "True".into(),
            ..Default::default()
        };
        let current = with_conditions(vec![
            other,
            available(ConditionStatus::False, "ServiceNotFound", "x", t(1)),
        ]);
        let next = available(ConditionStatus::True, "Passed", "all checks passed", t(7));
        let patch = available_condition_patch(&current, next).expect("a write");
        let conds = patch["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[0]["type"], "Other");
        assert_eq!(conds[1]["status"], "True");
        assert_eq!(
            conds[1]["lastTransitionTime"],
            serde_json::to_value(t(7)).unwrap()
        );
    }

    #[test]
    fn first_condition_is_written() {
        let mut current = with_conditions(Vec::new());
        current.status = None;
        let next = available(ConditionStatus::Unknown, "NoProbe", "not yet", t(3));
        let patch = available_condition_patch(&current, next).expect("a write");
        assert_eq!(patch["status"]["conditions"][0]["type"], "Available");
    }
}
