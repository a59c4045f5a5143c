//! Builders shared by the resolvers' tests: Services, EndpointSlices and watcher events in
//! namespace `wardle`, and a [`KubeResolver`] with synced caches.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use gateway_config::StaticService;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::json;

use super::slice_index::{SliceIndex, SliceWriter, SERVICE_NAME_LABEL};
use super::{KubeResolver, ResolveError, ResolveReason};
use crate::model::ServiceRef;

pub(super) fn svc_ref(port: u16) -> ServiceRef {
    ServiceRef {
        namespace: "wardle".into(),
        name: "api".into(),
        port,
    }
}

pub(super) fn service(name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "wardle", "name": name},
        "spec": spec,
    }))
    .unwrap()
}

pub(super) fn cluster_ip(ip: &str, ports: serde_json::Value) -> Service {
    service(
        "api",
        json!({"type": "ClusterIP", "clusterIP": ip, "ports": ports}),
    )
}

pub(super) fn https_port() -> serde_json::Value {
    json!([{"name": "https", "port": 443, "targetPort": 8443}])
}

pub(super) fn slice(
    name: &str,
    ports: serde_json::Value,
    endpoints: serde_json::Value,
) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "wardle", "name": name,
                     "labels": {SERVICE_NAME_LABEL: "api"}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    }))
    .unwrap()
}

pub(super) fn ready(ip: &str) -> serde_json::Value {
    json!({"addresses": [ip], "conditions": {"ready": true}})
}

pub(super) fn list<K: Clone>(items: Vec<K>) -> Vec<watcher::Event<K>> {
    let mut events = vec![watcher::Event::Init];
    events.extend(items.into_iter().map(watcher::Event::InitApply));
    events.push(watcher::Event::InitDone);
    events
}

pub(super) fn resolver(
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    endpoint_routing: bool,
) -> KubeResolver {
    let mut writer = Writer::<Service>::default();
    for e in list(services) {
        writer.apply_watcher_event(&e);
    }
    let index = Arc::new(SliceIndex::default());
    let mut slice_writer = SliceWriter::new(Arc::clone(&index));
    for e in list(slices) {
        slice_writer.apply_watcher_event(&e);
    }
    KubeResolver::from_parts(
        writer.as_reader(),
        Arc::new(AtomicBool::new(true)),
        index,
        endpoint_routing,
    )
}

pub(super) fn err(r: Result<impl fmt::Debug, ResolveError>) -> (ResolveReason, String) {
    let e = r.unwrap_err();
    (e.reason, e.message)
}

pub(super) fn static_service(port: Option<u16>, urls: &[&str]) -> StaticService {
    StaticService {
        namespace: "wardle".into(),
        name: "api".into(),
        port,
        urls: urls.iter().map(|u| u.to_string()).collect(),
    }
}
