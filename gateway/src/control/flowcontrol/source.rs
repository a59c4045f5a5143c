//! Where the configuration comes from: the FlowSchemas and PriorityLevelConfigurations of the
//! core (`flowcontrol.apiserver.k8s.io/v1`), watched as kube's configuration controller watches
//! them with its informers, or kube's built-in configuration when the core serves none.
//!
//! kube-apiserver keeps the mandatory and suggested objects in its API, so behind it the gateway
//! classifies exactly as it does, and an operator's own FlowSchemas apply to both. A core that
//! does not serve the kinds (404), or serves neither any object, gets kube's built-in objects,
//! so that every gateway divides its seats the same way whatever is behind it. The gateway only
//! reads: kube-apiserver writes their status.
//!
//! Every change is digested at once (a change takes effect well within a second) and logged in
//! one line when it changes what is in force.

use std::sync::Arc;

use apiservice::outage::Outage;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, Instrument};

use gateway_flowcontrol::bootstrap::Release;
use gateway_flowcontrol::controller::Summary;
use gateway_flowcontrol::FlowControl;

/// What the core says about one of the two kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listing {
    /// Not listed yet.
    Pending,
    /// Listed; the store holds the complete set.
    Synced,
    /// The core does not serve the kind (404).
    NotFound,
}

/// Where the configuration in force came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Core,
    BuiltIn,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::BuiltIn => "built-in",
        }
    }
}

/// Puts kube's built-in configuration in force (the `file` and `none` APIService sources, and
/// until the core's objects are listed).
pub fn use_built_in(fc: &FlowControl) {
    if let Some(summary) = fc.apply_built_in() {
        log_change(Origin::BuiltIn, &summary);
    }
}

/// Follows the core's release (`crate::control::core_release`): its built-in objects, in force
/// at once where the built-in configuration is.
pub fn follow_release(fc: &FlowControl, release: Release) {
    if let Some(summary) = fc.follow_release(release) {
        log_change(Origin::BuiltIn, &summary);
    }
}

/// Watches the core's objects and keeps the configuration in step, until the process ends.
pub async fn run(client: kube::Client, fc: Arc<FlowControl>) {
    let span = tracing::info_span!("flowcontrol_source");
    let outages = Outages::new();
    // Through `Outage::client`, a watch that resumes after an outage from its resourceVersion,
    // with no event to report, still says the core is back.
    let levels = watcher(
        Api::<PriorityLevelConfiguration>::all(outages.levels.client(client.clone())),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|o| o.managed_fields_mut().clear());
    let schemas = watcher(
        Api::<FlowSchema>::all(outages.schemas.client(client)),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|o| o.managed_fields_mut().clear());
    drive(levels, schemas, &fc, outages).instrument(span).await;
}

/// One [`Outage`] per watched kind.
struct Outages {
    levels: Arc<Outage>,
    schemas: Arc<Outage>,
}

impl Outages {
    fn new() -> Self {
        Self {
            levels: Arc::new(Outage::new("PriorityLevelConfiguration watch", MEANWHILE)),
            schemas: Arc::new(Outage::new("FlowSchema watch", MEANWHILE)),
        }
    }
}

/// What holds while a watch cannot reach the core, for its one warning.
const MEANWHILE: &str = "the priority and fairness configuration in force stays";

/// One kind's watch: its store, what the core said last, and whether the core answers it (one
/// warning when it stops, one line when it is back, as every client of the core).
struct Kind<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    listing: Listing,
    outage: Arc<Outage>,
}

impl<K> Kind<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Takes an event in; whether the kind's state changed.
    fn event(&mut self, event: Result<watcher::Event<K>, watcher::Error>) -> bool {
        let kind = K::kind(&());
        match event {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {
                self.outage.watch_event(&event);
                false
            }
            Ok(watcher::Event::InitDone) => {
                self.outage.answered();
                self.listing = Listing::Synced;
                true
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                self.outage.answered();
                self.listing == Listing::Synced
            }
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                if status.code == 404 =>
            {
                // An answer all the same: the core is there and says it has no such kind.
                self.outage.answered();
                let changed = self.listing != Listing::NotFound;
                if changed {
                    debug!(%kind, "the core does not serve it");
                }
                self.listing = Listing::NotFound;
                changed
            }
            Err(_) => {
                self.outage.watch_event(&event);
                false
            }
        }
    }

    fn objects(&self) -> Vec<K> {
        let mut v: Vec<K> = self.store.state().iter().map(|o| (**o).clone()).collect();
        v.sort_by_key(|o| o.name_any());
        v
    }
}

enum Either<A, B> {
    Levels(A),
    Schemas(B),
}

/// The loop over both watches, apart from the watchers so that tests can script them.
async fn drive<L, S>(levels: L, schemas: S, fc: &FlowControl, outages: Outages)
where
    L: Stream<Item = Result<watcher::Event<PriorityLevelConfiguration>, watcher::Error>> + Send,
    S: Stream<Item = Result<watcher::Event<FlowSchema>, watcher::Error>> + Send,
{
    let (level_store, level_writer) = reflector::store();
    let (schema_store, schema_writer) = reflector::store();
    let mut pl = Kind {
        store: level_store,
        listing: Listing::Pending,
        outage: outages.levels,
    };
    let mut fs = Kind {
        store: schema_store,
        listing: Listing::Pending,
        outage: outages.schemas,
    };
    let events = futures::stream::select(
        levels.reflect(level_writer).map(Either::Levels),
        schemas.reflect(schema_writer).map(Either::Schemas),
    );
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let mut changed = take(&mut pl, &mut fs, event);
        // A burst (a relist, an apply of many objects) is digested once.
        while let Some(Some(event)) = events.next().now_or_never() {
            changed |= take(&mut pl, &mut fs, event);
        }
        if changed {
            reconcile(&pl, &fs, fc);
        }
    }
}

fn take(
    pl: &mut Kind<PriorityLevelConfiguration>,
    fs: &mut Kind<FlowSchema>,
    event: Either<
        Result<watcher::Event<PriorityLevelConfiguration>, watcher::Error>,
        Result<watcher::Event<FlowSchema>, watcher::Error>,
    >,
) -> bool {
    match event {
        Either::Levels(e) => pl.event(e),
        Either::Schemas(e) => fs.event(e),
    }
}

fn reconcile(pl: &Kind<PriorityLevelConfiguration>, fs: &Kind<FlowSchema>, fc: &FlowControl) {
    let (origin, summary) = match (pl.listing, fs.listing) {
        (Listing::NotFound, _) | (_, Listing::NotFound) => (Origin::BuiltIn, fc.apply_built_in()),
        (Listing::Synced, Listing::Synced) => {
            let (l, s) = (pl.objects(), fs.objects());
            if l.is_empty() && s.is_empty() {
                (Origin::BuiltIn, fc.apply_built_in())
            } else {
                (Origin::Core, fc.apply_core(l, s))
            }
        }
        _ => return,
    };
    if let Some(summary) = summary {
        log_change(origin, &summary);
    }
}

fn log_change(origin: Origin, summary: &Summary) {
    let ignored: Vec<String> = summary
        .ignored
        .iter()
        .map(|i| format!("{} {}: {}", i.kind, i.name, i.reason))
        .collect();
    info!(
        source = origin.as_str(),
        priority_levels = summary.levels.len(),
        flow_schemas = summary.schemas.len(),
        ignored = %ignored.join("; "),
        "API Priority and Fairness configuration changed"
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::channel::mpsc;
    use prometheus::Registry;

    use super::*;
    use gateway_flowcontrol::controller::built_in_objects;

    type Tx<K> = mpsc::UnboundedSender<Result<watcher::Event<K>, watcher::Error>>;

    fn not_found() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(
            kube::core::Status::failure("not found", "NotFound")
                .with_code(404)
                .boxed(),
        ))
    }

    fn schema_names(fc: &FlowControl) -> Vec<String> {
        fc.controller()
            .current()
            .classifier
            .schemas()
            .iter()
            .map(|s| s.spec.name.to_string())
            .collect()
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn the_cores_objects_rule_and_a_core_without_them_gets_kubes() {
        let fc = Arc::new(FlowControl::new(
            100,
            Duration::from_secs(15),
            &Registry::new(),
        ));
        let (pl_tx, pl_rx): (Tx<PriorityLevelConfiguration>, _) = mpsc::unbounded();
        let (fs_tx, fs_rx): (Tx<FlowSchema>, _) = mpsc::unbounded();
        let task = tokio::spawn({
            let fc = fc.clone();
            async move { drive(pl_rx, fs_rx, &fc, Outages::new()).await }
        });
        // Before the lists: the mandatory configuration.
        assert_eq!(schema_names(&fc), ["exempt", "catch-all"]);

        // The core serves one level and one schema of its own.
        let (levels, mut schemas) = built_in_objects();
        let team = schemas.pop().unwrap();
        let mut mine = team.clone();
        mine.metadata.name = Some("mine".into());
        let send_pl = |e| pl_tx.unbounded_send(Ok(e)).unwrap();
        let send_fs = |e| fs_tx.unbounded_send(Ok(e)).unwrap();
        send_pl(watcher::Event::Init);
        for l in levels.clone() {
            send_pl(watcher::Event::InitApply(l));
        }
        send_pl(watcher::Event::InitDone);
        send_fs(watcher::Event::Init);
        send_fs(watcher::Event::InitApply(mine.clone()));
        send_fs(watcher::Event::InitDone);
        settle().await;
        assert_eq!(schema_names(&fc), ["exempt", "mine", "catch-all"]);

        // A change is in force as soon as it is seen.
        send_fs(watcher::Event::Apply(team.clone()));
        settle().await;
        assert_eq!(
            schema_names(&fc),
            ["exempt", "global-default", "mine", "catch-all"]
        );
        send_fs(watcher::Event::Delete(mine));
        send_fs(watcher::Event::Delete(team));
        send_pl(watcher::Event::Init);
        send_pl(watcher::Event::InitDone);
        settle().await;
        // Nothing left in the core: kube's built-in configuration.
        assert!(schema_names(&fc).contains(&"service-accounts".to_owned()));

        // A core that does not serve the kinds at all: the same.
        let fc2 = Arc::new(FlowControl::new(
            100,
            Duration::from_secs(15),
            &Registry::new(),
        ));
        let (pl_tx2, pl_rx2): (Tx<PriorityLevelConfiguration>, _) = mpsc::unbounded();
        let (_fs_tx2, fs_rx2): (Tx<FlowSchema>, _) = mpsc::unbounded();
        let task2 = tokio::spawn({
            let fc2 = fc2.clone();
            async move { drive(pl_rx2, fs_rx2, &fc2, Outages::new()).await }
        });
        pl_tx2.unbounded_send(Err(not_found())).unwrap();
        settle().await;
        assert!(schema_names(&fc2).contains(&"global-default".to_owned()));
        task.abort();
        task2.abort();
    }
}
