//! Which remote APIServices contribute to the merged `/openapi/v2`, what changed in that set, and
//! the merge itself.

use std::collections::HashMap;
use std::sync::Arc;

use apiservice::discovery::openapi_v2::{aggregate_loading, RemoteSpec};
use apiservice::discovery::openapi_v2_proto;
use apiservice::model::ServiceRef;
use apiservice::route_table::Availability;
use bytes::Bytes;
use serde_json::Value;

use super::{Encoded, OpenApiV2};
use crate::backend::remote::RemoteBackend;
use crate::control::apiservices::{Routes, Target};

/// One remote APIService's place in the merge.
#[derive(Clone, PartialEq)]
pub struct Contributor {
    pub name: String,
    group: String,
    version: String,
    group_priority_minimum: i32,
    version_priority: i32,
    pub service: ServiceRef,
}

/// A Service whose spec is fetched: the backend of its first APIService, and whether each of
/// its APIServices (by name) is available, so that a flip fetches the spec at once.
pub struct Backing {
    pub backend: Arc<RemoteBackend>,
    pub available: Vec<(String, bool)>,
}

/// The remote APIServices of `table` that contribute a spec, sorted by name, and their Services.
pub fn contributors(table: &Routes) -> (Vec<Contributor>, HashMap<ServiceRef, Backing>) {
    let mut contributors = Vec::new();
    let mut services: HashMap<ServiceRef, Backing> = HashMap::new();
    for route in table.routes() {
        let (Target::Remote(backend), Some(service)) =
            (&route.backend.target, route.api_service.service())
        else {
            continue;
        };
        let api = &route.api_service;
        contributors.push(Contributor {
            name: api.name.clone(),
            group: api.group.clone(),
            version: api.version.clone(),
            group_priority_minimum: api.group_priority_minimum,
            version_priority: api.version_priority,
            service: service.clone(),
        });
        let available = matches!(route.available, Availability::Available);
        services
            .entry(service.clone())
            .or_insert_with(|| Backing {
                backend: backend.clone(),
                available: Vec::new(),
            })
            .available
            .push((api.name.clone(), available));
    }
    contributors.sort_by(|a, b| a.name.cmp(&b.name));
    for backing in services.values_mut() {
        backing.available.sort();
    }
    (contributors, services)
}

/// How the contributing APIServices changed since the last merge, by name (the metric's
/// `apiservice` label, as kube-aggregator counts them): added, removed, or re-ordered.
pub fn set_changes(before: &[Contributor], now: &[Contributor]) -> Vec<(String, &'static str)> {
    let mut changes = Vec::new();
    for c in now {
        match before.iter().find(|b| b.name == c.name) {
            None => changes.push((c.name.clone(), "add")),
            Some(b) if b != c => changes.push((c.name.clone(), "update")),
            Some(_) => {}
        }
    }
    for b in before
        .iter()
        .filter(|b| !now.iter().any(|c| c.name == b.name))
    {
        changes.push((b.name.clone(), "delete"));
    }
    changes
}

/// The merged document in both forms. Specs are parsed here, one remote at a time.
pub fn build(
    core: &[u8],
    specs: &[(Contributor, Bytes)],
) -> Result<OpenApiV2, openapi_v2_proto::EncodeError> {
    let remotes: Vec<RemoteSpec<'_, &Bytes>> = specs
        .iter()
        .map(|(c, spec)| RemoteSpec {
            group: &c.group,
            version: &c.version,
            group_priority_minimum: c.group_priority_minimum,
            version_priority: c.version_priority,
            name: &c.name,
            spec,
        })
        .collect();
    // Every spec passed `check_spec` when it was fetched: each parses, and each encodes within
    // its own size limit, so the merge (parts of them) encodes within the sum of those.
    let limit = openapi_v2_proto::size_limit(
        core.len() + specs.iter().map(|(_, s)| s.len()).sum::<usize>(),
    );
    let core: Value = serde_json::from_slice(core).unwrap_or_default();
    let merged = aggregate_loading(core, remotes, |spec| serde_json::from_slice(spec).ok());
    let json = Bytes::from(serde_json::to_vec(&merged).unwrap_or_default());
    let protobuf = openapi_v2_proto::encode(&merged, limit)?;
    Ok(OpenApiV2 {
        json: Encoded::new(json),
        protobuf: Encoded::new(protobuf),
    })
}
