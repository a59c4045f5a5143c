//! Following the core's discovery as it changes, without polling delay.
//!
//! The core's `/apis` changes when a CustomResourceDefinition is established (or removed) and
//! when one of its APIServices changes (kube-apiserver registers a local APIService per CRD
//! group-version and per built-in group). So where the core serves them, the gateway watches
//! `customresourcedefinitions` and `apiservices` with kube-rs watchers, and every event marks
//! the core's documents dirty ([`Signals::revision`]); a revalidation costs one `If-None-Match`
//! round trip when nothing changed. Writes to those resources that pass through the gateway
//! revalidate at once too (see [`super::DiscoveryCache::revalidate_core`]), which is usually
//! earlier than the watch event.
//!
//! One race stays: a CRD turns `Established` a moment before or after the core's discovery lists
//! it (two controllers in kube-apiserver). The CRD watcher therefore publishes the served
//! group-versions of every established CRD ([`Signals::established`]); when the core's document
//! does not list one yet, the discovery controller fetches again after a short backoff
//! ([`ListingRetry`]), a bounded number of times.
//!
//! A core that serves neither resource gets no watcher (and no error lines); its documents are
//! polled instead ([`super::controller`]'s fallback interval).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use apiservice::discovery::CoreDiscovery;
use apiservice::outage::Outage;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::test_hook::TestPanic;

const APIEXTENSIONS: (&str, &str, &str) =
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions");
const APIREGISTRATION: (&str, &str, &str) = ("apiregistration.k8s.io", "v1", "apiservices");
/// What holds while a watch cannot reach the core.
const POLLED: &str = "the core's discovery is polled meanwhile";

/// What the watchers tell the discovery controller.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signals {
    /// Moves on every event of either watcher: the core's documents may have changed.
    pub revision: u64,
    /// `<group>/<version>` of every served version of every established CRD, once the CRD
    /// watch has listed.
    pub established: Arc<BTreeSet<String>>,
    /// How many watchers are synced and not failing. While one of those started is not (say the
    /// gateway may not list CRDs), the core's documents are polled as if it served neither.
    pub healthy: u8,
}

/// Which watchers run; each starts the first time the core's discovery lists its resource, and
/// again after a fetch of the core's discovery finds that it ended (a panic, a stream that
/// ended): a watcher is never gone silently.
pub struct CoreWatchers {
    client: Client,
    tx: watch::Sender<Signals>,
    crds: Option<JoinHandle<()>>,
    apiservices: Option<JoinHandle<()>>,
    /// The debug builds' hook: `core-watch/apiservices:<n>` panics its first `n` runs.
    apiservices_panics: TestPanic,
}

// === impl CoreWatchers ===

impl CoreWatchers {
    pub fn new(client: Client) -> (Self, watch::Receiver<Signals>) {
        let (tx, rx) = watch::channel(Signals::default());
        let watchers = Self {
            client,
            tx,
            crds: None,
            apiservices: None,
            apiservices_panics: TestPanic::from_env("core-watch/apiservices"),
        };
        (watchers, rx)
    }

    /// Whether every watcher the core's discovery called for is synced and not failing (then
    /// the core needs no short poll). One that is refused (RBAC without the CRD rule, say) while
    /// the other runs still misses every change the refused one would have reported, so anything
    /// short of all of them means the 1 s poll.
    pub fn watching(&self) -> bool {
        let started = u8::from(self.crds.is_some()) + u8::from(self.apiservices.is_some());
        started > 0 && self.tx.borrow().healthy >= started
    }

    /// Starts the watchers the core's discovery says it can serve and that do not run: never
    /// started, or ended since (logged once, then started again).
    pub fn start_served(&mut self, core: &CoreDiscovery) {
        if serves_watch(core, APIEXTENSIONS) && needs_start(&mut self.crds, APIEXTENSIONS) {
            tracing::info!("following the core's CustomResourceDefinitions with a watch");
            let outage = Arc::new(Outage::new("CustomResourceDefinition watch", POLLED));
            let api = Api::<CustomResourceDefinition>::all(outage.client(self.client.clone()));
            self.crds = Some(tokio::spawn(
                follow_crds(api, self.tx.clone(), outage).instrument(tracing::info_span!(
                    "core_watch",
                    resource = APIEXTENSIONS.2
                )),
            ));
        }
        if serves_watch(core, APIREGISTRATION)
            && needs_start(&mut self.apiservices, APIREGISTRATION)
        {
            tracing::info!("following the core's APIServices with a watch");
            let outage = Arc::new(Outage::new("APIService watch for discovery", POLLED));
            let api = Api::<APIService>::all(outage.client(self.client.clone()));
            let panics = self.apiservices_panics.panics_now();
            self.apiservices = Some(tokio::spawn(
                follow(
                    api,
                    self.tx.clone(),
                    outage,
                    |_: &Store<APIService>, _| {},
                    panics,
                )
                .instrument(tracing::info_span!(
                    "core_watch",
                    resource = APIREGISTRATION.2
                )),
            ));
        }
    }
}

/// Whether the watcher in `slot` is to be started: it never was, or it has ended (said once
/// here; until it runs again the core's discovery is polled).
fn needs_start(slot: &mut Option<JoinHandle<()>>, (_, _, resource): (&str, &str, &str)) -> bool {
    match slot {
        None => true,
        Some(task) if task.is_finished() => {
            tracing::error!(
                resource,
                "the watch of the core's {resource} ended; starting it again"
            );
            *slot = None;
            true
        }
        Some(_) => false,
    }
}

/// Whether the core lists `resource` of `group/version` with the `watch` verb.
fn serves_watch(core: &CoreDiscovery, (group, version, resource): (&str, &str, &str)) -> bool {
    core.apis
        .items
        .iter()
        .filter(|g| g.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some(group))
        .flat_map(|g| &g.versions)
        .filter(|v| v.version.as_deref() == Some(version))
        .flat_map(|v| &v.resources)
        .any(|r| r.resource.as_deref() == Some(resource) && r.verbs.iter().any(|v| v == "watch"))
}

async fn follow_crds(
    api: Api<CustomResourceDefinition>,
    tx: watch::Sender<Signals>,
    outage: Arc<Outage>,
) {
    follow(
        api,
        tx,
        outage,
        |store, signals| signals.established = Arc::new(established_versions(store)),
        false,
    )
    .await
}

/// Runs one watcher until the controller is gone: a reflector over `api`, and after its first
/// complete list and every later change, `update` plus a new revision on `tx`. Errors are
/// retried with kube-rs' default backoff and logged once per outage. `panics` (the test hook):
/// panic as soon as this watcher counts as healthy.
async fn follow<K>(
    api: Api<K>,
    tx: watch::Sender<Signals>,
    outage: Arc<Outage>,
    update: impl Fn(&Store<K>, &mut Signals),
    panics: bool,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    let mut synced = false;
    let mut healthy = Healthy {
        tx: &tx,
        counted: false,
    };
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            () = tx.closed() => return,
        };
        let Some(event) = event else { return };
        outage.watch_event(&event);
        let changed = match event {
            Ok(watcher::Event::InitDone) => {
                synced = true;
                true
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => synced,
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) | Err(_) => false,
        };
        let now_healthy = synced && !outage.is_down();
        if changed || now_healthy != healthy.counted {
            let was = std::mem::replace(&mut healthy.counted, now_healthy);
            tx.send_modify(|signals| {
                signals.revision += 1;
                match (was, now_healthy) {
                    (false, true) => signals.healthy += 1,
                    (true, false) => signals.healthy = signals.healthy.saturating_sub(1),
                    _ => {}
                }
                update(&store, signals);
            });
            assert!(
                !(panics && healthy.counted),
                "AGGREGATION_GATEWAY_TEST_PANIC asked this watch to panic"
            );
        }
    }
}

/// A watcher's share of [`Signals::healthy`], taken back however the watcher ends (a panic
/// included): the controller then polls the core's discovery until it runs again.
struct Healthy<'a> {
    tx: &'a watch::Sender<Signals>,
    counted: bool,
}

impl Drop for Healthy<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.tx.send_modify(|signals| {
                signals.revision += 1;
                signals.healthy = signals.healthy.saturating_sub(1);
            });
        }
    }
}

/// The served group-versions of every established CRD in `store`.
fn established_versions(store: &Store<CustomResourceDefinition>) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .filter(|crd| {
            crd.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
        })
        .flat_map(|crd| {
            crd.spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| format!("{}/{}", crd.spec.group, v.name))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The group-versions in `established` that `core` does not list (yet).
pub fn unlisted<'a>(established: &'a BTreeSet<String>, core: &CoreDiscovery) -> Vec<&'a str> {
    established
        .iter()
        .map(String::as_str)
        .filter(|gv| {
            let (group, version) = gv.split_once('/').unwrap_or(("", gv));
            !core.apis.items.iter().any(|g| {
                g.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some(group)
                    && g.versions
                        .iter()
                        .any(|v| v.version.as_deref() == Some(version))
            })
        })
        .collect()
}

/// Fetches the core's documents again soon while an established CRD is not listed in them:
/// every 20 ms for the first 300 ms (the usual gap between kube-apiserver's establishing and
/// discovery controllers, so the gateway lags the core by one step at most while a client that
/// just saw `Established` asks for `/apis`), then doubling from 40 ms, for at most
/// [`ListingRetry::ATTEMPTS`] attempts (about 5.4 s in all), after which the watch events and the
/// resync take over again. Each attempt is one `If-None-Match` round trip to the core.
#[derive(Debug, Default)]
pub struct ListingRetry {
    attempts: u32,
}

// === impl ListingRetry ===

impl ListingRetry {
    pub const ATTEMPTS: u32 = 22;
    const STEP: Duration = Duration::from_millis(20);
    /// Attempts at [`Self::STEP`] before backing off.
    const CLOSE: u32 = 15;

    /// After a core fetch: `Some(delay)` to fetch again after, or `None` (all listed, or given
    /// up). `missing` is what [`unlisted`] found.
    pub fn next(&mut self, missing: &[&str]) -> Option<Duration> {
        if missing.is_empty() {
            self.attempts = 0;
            return None;
        }
        if self.attempts >= Self::ATTEMPTS {
            return None;
        }
        let delay = match self.attempts.checked_sub(Self::CLOSE) {
            None => Self::STEP,
            Some(backed_off) => Self::STEP * 2u32.pow(backed_off + 1),
        };
        self.attempts += 1;
        if self.attempts == Self::ATTEMPTS {
            tracing::info!(group_versions = ?missing,
                "established CustomResourceDefinitions are still not in the core's discovery; last early re-fetch");
        }
        Some(delay)
    }

    /// The set of established CRDs changed: a new round of attempts.
    pub fn reset(&mut self) {
        self.attempts = 0;
    }
}

/// When to revalidate the core's OpenAPI documents (the v2 spec, the v3 root) after a change of
/// its CRDs: at once, then at each of [`FollowUps::AFTER`] (kube-apiserver's OpenAPI controllers
/// publish a CRD's schema a moment after the CRD is stored: BENCHMARKS.md, "Why the code is
/// shaped so"). A new change starts the schedule again. Each revalidation is one conditional GET.
#[derive(Debug, Default)]
pub struct FollowUps {
    due: std::collections::VecDeque<tokio::time::Instant>,
}

impl FollowUps {
    const AFTER: [Duration; 5] = [
        Duration::ZERO,
        Duration::from_millis(200),
        Duration::from_millis(500),
        Duration::from_secs(1),
        Duration::from_secs(2),
    ];

    pub fn start(&mut self, now: tokio::time::Instant) {
        self.due = Self::AFTER.iter().map(|after| now + *after).collect();
    }

    /// Waits for the next one due (forever when none is).
    pub async fn next(&mut self) {
        match self.due.front() {
            Some(at) => {
                tokio::time::sleep_until(*at).await;
                self.due.pop_front();
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::discovery::v2::APIGroupDiscoveryList;

    fn core(groups: serde_json::Value) -> CoreDiscovery {
        let apis: APIGroupDiscoveryList = serde_json::from_value(serde_json::json!({
            "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {}, "items": groups
        }))
        .unwrap();
        CoreDiscovery {
            api: APIGroupDiscoveryList::default(),
            apis,
        }
    }

    fn group(name: &str, version: &str, resource: &str, verbs: &[&str]) -> serde_json::Value {
        serde_json::json!({"metadata": {"name": name}, "versions": [{"version": version,
            "resources": [{"resource": resource, "verbs": verbs,
                           "responseKind": {"group": "", "version": "", "kind": "K"},
                           "scope": "Cluster"}]}]})
    }

    #[test]
    fn watchers_start_only_for_what_the_core_serves() {
        let both = core(serde_json::json!([
            group(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                &["list", "watch"]
            ),
            group(
                "apiregistration.k8s.io",
                "v1",
                "apiservices",
                &["list", "watch"]
            ),
        ]));
        assert!(serves_watch(&both, APIEXTENSIONS));
        assert!(serves_watch(&both, APIREGISTRATION));
        // Listed without watch, another version, or not at all: no watcher.
        let neither = core(serde_json::json!([
            group(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                &["list"]
            ),
            group(
                "apiregistration.k8s.io",
                "v1beta1",
                "apiservices",
                &["watch"]
            ),
        ]));
        assert!(!serves_watch(&neither, APIEXTENSIONS));
        assert!(!serves_watch(&neither, APIREGISTRATION));
        assert!(!serves_watch(&core(serde_json::json!([])), APIEXTENSIONS));
    }

    #[test]
    fn unlisted_names_the_established_group_versions_the_core_lacks() {
        let doc = core(serde_json::json!([group(
            "a.example.com",
            "v1",
            "as",
            &["get"]
        )]));
        let established: BTreeSet<String> =
            ["a.example.com/v1", "a.example.com/v2", "b.example.com/v1"]
                .map(String::from)
                .into();
        assert_eq!(
            unlisted(&established, &doc),
            ["a.example.com/v2", "b.example.com/v1"]
        );
    }

    #[test]
    fn listing_retry_backs_off_and_gives_up() {
        let mut retry = ListingRetry::default();
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
        let delays: Vec<_> = (0..ListingRetry::ATTEMPTS + 1)
            .map(|_| ms(retry.next(&["x/v1"])))
            .collect();
        let mut want = vec![Some(20); 15];
        want.extend([40, 80, 160, 320, 640, 1280, 2560].map(Some));
        want.push(None);
        assert_eq!(delays, want);
        retry.reset();
        assert_eq!(ms(retry.next(&["x/v1"])), Some(20));
        // Listed: done, and the next gap starts from the first step again.
        assert_eq!(retry.next(&[]), None);
        assert_eq!(ms(retry.next(&["x/v1"])), Some(20));
    }
}
