//! Merged discovery and OpenAPI, the documents the gateway answers itself: the loops that keep
//! them and the snapshot they publish.
//!
//! kube-aggregator serves `/apis`, `/apis/<group>`, aggregated `/api` and the `/openapi/v3` root
//! from its own state, because only it knows every APIService's backend. The gateway does the
//! same, split the way the rest of the gateway is split:
//!
//! * [`fetch`]: one bounded GET of a document with the gateway's own credentials, and the OpenAPI
//!   v3 root's revalidation.
//! * [`core`]: the core server's documents (aggregated, or legacy ones converted).
//! * [`core_watch`]: when the core's documents change: watchers of its CRDs and APIServices.
//! * [`backends`]: one backing Service's documents and what is cached of them.
//! * [`controller`]: one work queue over those fetches; it publishes new immutable snapshots
//!   ([`DiscoveryCache`]) only when an input changed. All JSON work happens there.
//! * [`readiness`]: the `/readyz` check that waits for the first discovery of the APIServices.
//! * the request path is `crate::handlers::discovery`, a layer above: one `ArcSwap` load of the
//!   [`DiscoveryCache`], a header comparison, prepared bytes out; anything it does not answer
//!   falls through to the router (`None`).
//! * [`openapi`]: the OpenAPI v3 pieces: which backend owns which `/openapi/v3/<path>`, and the
//!   pass-through for group-version documents of remote backends.
//! * [`openapi_converted`]: OpenAPI v3 documents for remote backends that serve only v2.
//! * [`openapi_v2`]: the merged `/openapi/v2` (JSON and protobuf), kept by a loop of its own.
//!
//! Until the first merge completed (the core was never reached) the handlers answer nothing and
//! the core server serves its own documents: an empty `/apis` would make clients forget every
//! group, which is worse than a document without the APIServices for a few seconds.

pub mod backends;
pub mod controller;
pub mod core;
pub mod core_watch;
pub mod fetch;
pub mod openapi;
pub mod openapi_converted;
pub mod openapi_v2;
pub mod readiness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use apiservice::discovery::{MergedDiscovery, MergedOpenApiRoot, ServedVersions};
use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::Notify;

use crate::backend::remote::RemoteBackend;
use crate::control::apiservices::Routing;
use crate::metrics::KnownResources;

pub use controller::DiscoveryController;

/// Whether a request writes the resources the core's discovery is made of:
/// CustomResourceDefinitions (a CRD group comes or goes) and APIServices (kube-apiserver lists
/// local ones). When the core answers it with a 2xx, the router calls
/// [`DiscoveryCache::revalidate_core`]. Only compares a few strings the request-info layer
/// already parsed; bodies are never read.
pub fn writes_core_discovery(info: &crate::request_info::RequestInfo) -> bool {
    info.is_resource_request
        && info.is_mutating()
        && matches!(
            (info.api_group(), info.resource()),
            ("apiextensions.k8s.io", "customresourcedefinitions")
                | ("apiregistration.k8s.io", "apiservices")
        )
}

/// Who answers `/openapi/v3/<path>` for one path of the merged root.
#[derive(Clone)]
pub enum OpenApiOwner {
    /// The core server: the request falls through to it unchanged.
    Core,
    /// A remote APIService's backend, reached with the gateway's own credentials.
    Remote(Arc<RemoteBackend>),
    /// The gateway itself, from a v2-only backend's spec converted to v3.
    Converted(Arc<openapi_converted::ConvertedDocument>),
}

/// The merged `/openapi/v3` root plus the owner of each path.
pub type OpenApiSnapshot = MergedOpenApiRoot<OpenApiOwner>;

/// The snapshots the discovery handlers serve. Written only by the [`DiscoveryController`], read
/// by every request for `/api`, `/apis`, `/apis/<group>` and `/openapi/v3...`.
pub struct DiscoveryCache {
    pub(crate) merged: ArcSwapOption<MergedDiscovery>,
    pub(crate) openapi: ArcSwapOption<OpenApiSnapshot>,
    /// The merged `/openapi/v2`, `None` until the core's spec was first fetched.
    pub(crate) openapi_v2: ArcSwapOption<openapi_v2::OpenApiV2>,
    /// The names the merged documents list: the vocabulary of the request metrics' labels.
    known_resources: ArcSwap<KnownResources>,
    /// Read on `/api` only, to let a remote `v1.` APIService keep all of `/api`.
    pub(crate) routing: Arc<Routing>,
    /// Woken by [`DiscoveryCache::revalidate_core`]; the controller revalidates the core's
    /// documents at once. A `Notify` keeps one wake-up when nobody waits, so none is lost.
    pub(crate) core_written: Notify,
    /// True while a CustomResourceDefinition the core has established is not in the core's
    /// discovery yet (see `core_watch`): `/apis` and `/apis/<group>` wait briefly for it.
    pub(crate) listing_pending: tokio::sync::watch::Sender<bool>,
    /// Moves whenever the core's CRDs or APIServices changed (a watch event, or a write through
    /// the gateway): the `/openapi/v2` loop revalidates the core's spec then, not only every
    /// minute.
    pub(crate) core_changed: tokio::sync::watch::Sender<u64>,
    /// Whether `/api` and `/apis` still answer in `apidiscovery.k8s.io/v2beta1`: as the core
    /// does ([`crate::control::core_release`] sets it from the core's answer and release).
    v2beta1_served: AtomicBool,
}

impl DiscoveryCache {
    pub fn new(routing: Arc<Routing>) -> Self {
        Self {
            merged: ArcSwapOption::empty(),
            openapi: ArcSwapOption::empty(),
            openapi_v2: ArcSwapOption::empty(),
            known_resources: ArcSwap::from_pointee(KnownResources::default()),
            routing,
            core_written: Notify::new(),
            listing_pending: tokio::sync::watch::channel(false).0,
            core_changed: tokio::sync::watch::channel(0).0,
            v2beta1_served: AtomicBool::new(true),
        }
    }

    /// The aggregated discovery versions `/api` and `/apis` answer in.
    pub fn served_versions(&self) -> ServedVersions {
        if self.v2beta1_served.load(Ordering::Relaxed) {
            ServedVersions::V2AndV2Beta1
        } else {
            ServedVersions::V2Only
        }
    }

    pub fn serve_versions(&self, served: ServedVersions) {
        self.v2beta1_served
            .store(served == ServedVersions::V2AndV2Beta1, Ordering::Relaxed);
    }

    /// A write that may change the core's discovery passed through the gateway and succeeded:
    /// revalidate the core's documents now rather than at the next watch event or resync.
    /// Costs one atomic operation; called from the request path.
    pub fn revalidate_core(&self) {
        self.core_written.notify_one();
    }

    /// The current merged discovery, `None` before the first merge.
    pub fn merged(&self) -> Option<Arc<MergedDiscovery>> {
        self.merged.load_full()
    }

    /// The current OpenAPI v3 root, `None` before the core's root was first fetched.
    pub fn openapi(&self) -> Option<Arc<OpenApiSnapshot>> {
        self.openapi.load_full()
    }

    /// The group, version, resource and subresource names the merged discovery lists.
    pub fn known_resources(&self) -> arc_swap::Guard<Arc<KnownResources>> {
        self.known_resources.load()
    }

    pub(crate) fn store_merged(&self, merged: MergedDiscovery) {
        // Indexed here, once per change, so labelling a request is a lookup.
        let known = KnownResources::from_aggregated([&merged.apis.v2[..], &merged.api.v2[..]]);
        self.merged.store(Some(Arc::new(merged)));
        self.known_resources.store(Arc::new(known));
    }

    pub(crate) fn store_openapi_v2(&self, doc: openapi_v2::OpenApiV2) {
        self.openapi_v2.store(Some(Arc::new(doc)));
    }

    pub(crate) fn store_openapi(&self, root: OpenApiSnapshot) {
        self.openapi.store(Some(Arc::new(root)));
    }
}
