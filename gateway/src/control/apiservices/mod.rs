//! The APIService controllers: the routing snapshot the router reads, and the two controllers
//! that keep it current (kube-aggregator's `apiservice_controller.go` and
//! `remote_available_controller.go`). The request path only ever `load`s an immutable
//! `RouteTable` ([`Routing`]); the controllers follow it on a `watch` channel:
//!
//! * [`route_controller`]: builds the next table whenever the APIService set, the availability
//!   results or the proxy client certificate change (one key: the table);
//! * [`remote_available_controller`]: checks each APIService on its own work-queue key and publishes the
//!   results the route controller reads (and, with the kube source, writes the `Available`
//!   condition back to the core).

use std::collections::HashMap;
use std::sync::Arc;

use apiservice::route_table::{Availability, RouteTable};
use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::backend::remote::RemoteBackend;

use crate::extensions::RoutedTo;
use crate::health_check::Check;

pub mod remote_available_controller;
pub mod route_controller;
#[cfg(test)]
mod tests;

pub use remote_available_controller::AvailabilityController;
pub use route_controller::{BackendFactory, ProxyIdentity, RouteController};

/// What a route leads to.
#[derive(Clone)]
pub enum Target {
    /// A local APIService: served by the core server.
    Local,
    Remote(Arc<RemoteBackend>),
    /// A remote APIService whose transport could not be built (e.g. a bad caBundle): requests
    /// get a 503 naming the reason.
    Broken(Arc<str>),
}

/// A route's target plus how responses from it are tagged (`apiservice/<name>`), both built
/// once per route table so the request path only clones `Arc`s.
pub struct RouteTarget {
    pub target: Target,
    pub routed_to: RoutedTo,
}

pub type Routes = RouteTable<RouteTarget>;
pub type AvailabilityMap = Arc<HashMap<String, Availability>>;

/// The current routes plus the signals around them.
pub struct Routing {
    table: ArcSwap<Routes>,
    /// Readiness check `apiservice-sources-synced`: passes after the first complete set.
    pub synced: Arc<Check>,
    /// The same table for the controllers that follow it (availability, discovery): `None`
    /// until the first complete set, then every table the route controller builds.
    updates: watch::Sender<Option<Arc<Routes>>>,
}

impl Routing {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            table: ArcSwap::from_pointee(RouteTable::empty()),
            synced: Check::unhealthy("APIService source has not completed its first sync"),
            updates: watch::channel(None).0,
        })
    }

    /// Every route table from the first complete one on; see [`Routing::publish`].
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Routes>>> {
        self.updates.subscribe()
    }

    /// Installs `table` for the request path and hands it to the controllers that follow it.
    fn publish(&self, table: Routes) {
        let table = Arc::new(table);
        self.table.store(table.clone());
        self.updates.send_replace(Some(table));
    }

    pub fn load(&self) -> arc_swap::Guard<Arc<Routes>> {
        self.table.load()
    }

    pub fn load_full(&self) -> Arc<Routes> {
        self.table.load_full()
    }

    pub fn is_synced(&self) -> bool {
        self.synced.is_ok()
    }

    /// For `--apiservice-source=none`: no APIServices, routing is complete at once.
    pub fn mark_synced_empty(&self) {
        self.synced.pass();
    }
}
