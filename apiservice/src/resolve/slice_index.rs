//! EndpointSlices indexed by their Service, for endpoint routing and the availability checks.
//!
//! kube-rs's reflector store is keyed by object, so finding one Service's slices would scan every
//! slice in the cluster on each request; this index keeps them by Service instead, with the
//! reflector's relist behaviour.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::ResourceExt;

/// Label EndpointSlices carry to name their Service.
pub(super) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

pub(super) type SlicesByName = BTreeMap<String, Arc<EndpointSlice>>;

/// EndpointSlices indexed by their Service, as kube's `NewEndpointSliceIndexerGetter` does: a
/// request looks at one Service's slices instead of scanning every slice in the cluster.
///
/// Readers take a short read lock (as kube-runtime's `Store` does); the one writer is the watcher
/// task. Relists are buffered and swapped in at `InitDone`, like the reflector.
#[derive(Default)]
pub(super) struct SliceIndex {
    map: RwLock<SliceMap>,
    synced: AtomicBool,
}

#[derive(Default)]
struct SliceMap {
    /// namespace → service name → slice name → slice.
    by_service: HashMap<String, HashMap<String, SlicesByName>>,
    /// (namespace, slice name) → service name, to find a slice's old entry when it changes.
    owner: HashMap<(String, String), String>,
}

// === impl SliceIndex ===

impl SliceIndex {
    pub(super) fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub(super) fn with_service<R>(
        &self,
        ns: &str,
        svc: &str,
        f: impl FnOnce(Option<&SlicesByName>) -> R,
    ) -> R {
        // A poisoned lock only means a writer panicked mid-update; the map is still usable.
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        f(map.by_service.get(ns).and_then(|m| m.get(svc)))
    }
}

// === impl SliceMap ===

impl SliceMap {
    fn remove(&mut self, ns: &str, slice_name: &str) {
        let Some(svc) = self.owner.remove(&(ns.to_owned(), slice_name.to_owned())) else {
            return;
        };
        if let Some(services) = self.by_service.get_mut(ns) {
            if let Some(slices) = services.get_mut(&svc) {
                slices.remove(slice_name);
                if slices.is_empty() {
                    services.remove(&svc);
                }
            }
            if services.is_empty() {
                self.by_service.remove(ns);
            }
        }
    }

    fn insert(&mut self, slice: &EndpointSlice) {
        let (Some(ns), Some(name)) = (
            slice.metadata.namespace.as_deref(),
            slice.metadata.name.as_deref(),
        ) else {
            return;
        };
        self.remove(ns, name);
        // Slices not managed for a Service (no label) are nobody's endpoints here.
        let Some(svc) = slice.labels().get(SERVICE_NAME_LABEL) else {
            return;
        };
        self.owner
            .insert((ns.to_owned(), name.to_owned()), svc.clone());
        self.by_service
            .entry(ns.to_owned())
            .or_default()
            .entry(svc.clone())
            .or_default()
            .insert(name.to_owned(), Arc::new(slice.clone()));
    }
}

// === impl SliceWriter ===

/// The watcher side of a [`SliceIndex`].
pub(super) struct SliceWriter {
    index: Arc<SliceIndex>,
    /// The relist in progress, swapped in at `InitDone`.
    buffer: Option<SliceMap>,
}

impl SliceWriter {
    pub(super) fn new(index: Arc<SliceIndex>) -> Self {
        Self {
            index,
            buffer: None,
        }
    }

    pub(super) fn apply_watcher_event(&mut self, event: &watcher::Event<EndpointSlice>) {
        match event {
            watcher::Event::Init => self.buffer = Some(SliceMap::default()),
            watcher::Event::InitApply(slice) => self
                .buffer
                .get_or_insert_with(SliceMap::default)
                .insert(slice),
            watcher::Event::InitDone => {
                let next = self.buffer.take().unwrap_or_default();
                *self
                    .index
                    .map
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = next;
                self.index.synced.store(true, Ordering::Release);
            }
            watcher::Event::Apply(slice) => self
                .index
                .map
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(slice),
            watcher::Event::Delete(slice) => {
                if let (Some(ns), Some(name)) = (
                    slice.metadata.namespace.as_deref(),
                    slice.metadata.name.as_deref(),
                ) {
                    self.index
                        .map
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(ns, name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::fixtures::{list, slice};
    use serde_json::json;

    #[test]
    fn slice_index_relists_swap_at_init_done() {
        let index = Arc::new(SliceIndex::default());
        let mut w = SliceWriter::new(Arc::clone(&index));
        let port = json!([{"name": "https", "port": 8443}]);
        let count =
            |index: &SliceIndex| index.with_service("wardle", "api", |s| s.map_or(0, |s| s.len()));

        for e in list(vec![
            slice("a", port.clone(), json!([])),
            slice("b", port.clone(), json!([])),
        ]) {
            w.apply_watcher_event(&e);
        }
        assert!(index.synced());
        assert_eq!(count(&index), 2);

        // Mid-relist, readers still see the previous complete state.
        w.apply_watcher_event(&watcher::Event::Init);
        w.apply_watcher_event(&watcher::Event::InitApply(slice(
            "c",
            port.clone(),
            json!([]),
        )));
        assert_eq!(count(&index), 2);
        w.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(count(&index), 1);

        // A slice relabelled to another Service moves; a deleted one goes.
        let mut moved = slice("c", port.clone(), json!([]));
        moved
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(SERVICE_NAME_LABEL.into(), "other".into());
        w.apply_watcher_event(&watcher::Event::Apply(moved.clone()));
        assert_eq!(count(&index), 0);
        assert_eq!(
            index.with_service("wardle", "other", |s| s.map_or(0, |s| s.len())),
            1
        );
        w.apply_watcher_event(&watcher::Event::Delete(moved));
        assert!(index.map.read().unwrap().by_service.is_empty());
        assert!(index.map.read().unwrap().owner.is_empty());
    }
}
