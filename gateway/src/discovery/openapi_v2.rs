//! `/openapi/v2`: the core's Swagger spec merged with every remote APIService's, as
//! kube-aggregator serves it, in JSON and in the protobuf form `kubectl explain` asks for.
//!
//! kube-aggregator's users pay for this in CPU and memory (kubernetes#105932, #101755): it
//! re-merges large specs often. Here one loop owns it ([`OpenApiV2Controller`]):
//! - each spec is revalidated with its ETag every [`REFRESH`], and at once when the routes
//!   change; a 304 costs nothing;
//! - the merge (`apiservice::discovery::openapi_v2`) and the encodings run only when a
//!   contributing spec or the APIService set changed, on a blocking thread, off the request path;
//! - requests read prepared bytes ([`OpenApiV2`]) and answer `If-None-Match` with 304.
//!
//! A backend that fails keeps its last spec; one that never answered is left out. Until the
//! core's spec has been fetched once nothing is published, and `/openapi/v2` goes to the core as
//! before.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiservice::discovery::openapi_v2::{aggregate, RemoteSpec};
use apiservice::discovery::{etag_for, openapi_v2_proto};
use apiservice::model::ServiceRef;
use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;

use super::fetch::{Source, OPENAPI_TIMEOUT};
use super::DiscoveryCache;
use crate::backend::core::CoreBackend;
use crate::metrics::Metrics;
use crate::routing::{Routes, Routing, Target};

/// How often every spec is revalidated.
pub const REFRESH: Duration = Duration::from_secs(60);
/// The Content-Type of the protobuf form, as kube-openapi answers it. Clients ask for it as
/// `application/com.github.proto-openapi.spec.v2@v1.0+protobuf` (client-go's `OpenAPISchema()`)
/// or with this name; Go's MIME parser refuses the `@` form in a Content-Type.
pub const CONTENT_TYPE_PROTOBUF: &str =
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
const PATH: &str = "/openapi/v2";

/// The merged spec as served.
pub struct OpenApiV2 {
    pub json: Bytes,
    pub json_etag: String,
    pub protobuf: Bytes,
    pub protobuf_etag: String,
}

/// What one server last said at `/openapi/v2`.
#[derive(Default)]
struct SpecState {
    spec: Option<Arc<Value>>,
    etag: Option<String>,
    /// The last failure, to log changes only.
    error: Option<String>,
}

/// Keeps [`DiscoveryCache`]'s `/openapi/v2` current; see the module docs.
pub struct OpenApiV2Controller {
    cache: Arc<DiscoveryCache>,
    core: Arc<CoreBackend>,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
}

/// One remote APIService's place in the merge.
#[derive(Clone, PartialEq)]
struct Contributor {
    name: String,
    group: String,
    version: String,
    group_priority_minimum: i32,
    version_priority: i32,
    service: ServiceRef,
}

impl OpenApiV2Controller {
    pub fn new(
        cache: Arc<DiscoveryCache>,
        core: Arc<CoreBackend>,
        routing: Arc<Routing>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            cache,
            core,
            routing,
            metrics,
        }
    }

    pub async fn run(self) {
        let mut routes = self.routing.subscribe();
        let mut tick = tokio::time::interval(REFRESH);
        let mut core = SpecState::default();
        let mut remotes: HashMap<ServiceRef, SpecState> = HashMap::new();
        let mut merged_from: Option<Vec<Contributor>> = None;
        loop {
            tokio::select! {
                changed = routes.changed() => if changed.is_err() { return },
                _ = tick.tick() => {}
            }
            let Some(table) = routes.borrow_and_update().clone() else {
                continue;
            };
            let (contributors, backends) = contributors(&table);
            let mut reasons: Vec<(String, &'static str)> = Vec::new();
            if let Some(reason) = refresh(&Source::Core(self.core.clone()), &mut core, "core").await
            {
                reasons.push(("core".into(), reason));
            }
            remotes.retain(|svc, _| backends.contains_key(svc));
            for (svc, backend) in &backends {
                let state = remotes.entry(svc.clone()).or_default();
                let name = backend.name.to_string();
                if let Some(reason) = refresh(&Source::Remote(backend.clone()), state, &name).await
                {
                    reasons.push((name, reason));
                }
            }
            let Some(core_spec) = core.spec.clone() else {
                continue;
            };
            reasons.extend(set_changes(
                merged_from.as_deref().unwrap_or_default(),
                &contributors,
            ));
            if reasons.is_empty() {
                continue;
            }
            let specs: Vec<(Contributor, Arc<Value>)> = contributors
                .iter()
                .filter_map(|c| Some((c.clone(), remotes.get(&c.service)?.spec.clone()?)))
                .collect();
            let started = Instant::now();
            let built = tokio::task::spawn_blocking(move || build(&core_spec, &specs)).await;
            match built {
                Ok(Ok(doc)) => {
                    self.cache.store_openapi_v2(doc);
                    merged_from = Some(contributors);
                    for (apiservice, reason) in &reasons {
                        self.metrics
                            .openapi_v2_regeneration_count
                            .with_label_values(&[apiservice.as_str(), reason])
                            .inc();
                    }
                    let reason = reasons.first().map_or("update", |r| r.1);
                    self.metrics
                        .openapi_v2_regeneration_duration
                        .with_label_values(&[reason])
                        .set(started.elapsed().as_secs_f64());
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot encode the merged /openapi/v2; serving the previous one")
                }
                Err(e) => tracing::error!(error = %e, "merging /openapi/v2 failed"),
            }
        }
    }
}

/// How the contributing APIServices changed since the last merge, by name (the metric's
/// `apiservice` label, as kube-aggregator counts them): added, removed, or re-ordered.
fn set_changes(before: &[Contributor], now: &[Contributor]) -> Vec<(String, &'static str)> {
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

/// The remote APIServices of `table` that contribute a spec, and one backend per Service.
fn contributors(
    table: &Routes,
) -> (
    Vec<Contributor>,
    HashMap<ServiceRef, Arc<crate::backend::remote::RemoteBackend>>,
) {
    let mut contributors = Vec::new();
    let mut backends = HashMap::new();
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
        backends
            .entry(service.clone())
            .or_insert_with(|| backend.clone());
    }
    contributors.sort_by(|a, b| a.name.cmp(&b.name));
    (contributors, backends)
}

/// Revalidates one server's spec; the reason of a change (`add`, `update`, `delete`) or `None`.
async fn refresh(source: &Source, state: &mut SpecState, name: &str) -> Option<&'static str> {
    let fetched = source
        .get(
            PATH,
            "application/json",
            state.etag.as_deref(),
            OPENAPI_TIMEOUT,
        )
        .await;
    let outcome = match fetched {
        Ok(answer) if answer.status == StatusCode::NOT_MODIFIED && state.spec.is_some() => Ok(None),
        Ok(answer) if answer.status == StatusCode::OK => {
            match serde_json::from_slice::<Value>(&answer.body) {
                Ok(spec) if spec.is_object() => {
                    let reason = match &state.spec {
                        None => Some("add"),
                        Some(old) if **old != spec => Some("update"),
                        Some(_) => None,
                    };
                    state.spec = Some(Arc::new(spec));
                    state.etag = answer.etag();
                    Ok(reason)
                }
                _ => Err(format!("GET {PATH}: the body is not a JSON object")),
            }
        }
        Ok(answer) if answer.status == StatusCode::NOT_FOUND => {
            state.etag = None;
            Ok(state.spec.take().map(|_| "delete"))
        }
        Ok(answer) => Err(format!("GET {PATH}: {}", answer.status)),
        Err(e) => Err(e.to_string()),
    };
    match outcome {
        Ok(reason) => {
            if state.error.take().is_some() {
                tracing::info!(apiservice = name, "OpenAPI v2 spec fetched again");
            }
            reason
        }
        Err(e) => {
            if state.error.as_deref() != Some(&e) {
                tracing::warn!(apiservice = name, error = %e,
                    "cannot fetch the OpenAPI v2 spec; keeping the last one");
                state.error = Some(e);
            }
            None
        }
    }
}

/// The merged document in both forms.
fn build(
    core: &Value,
    specs: &[(Contributor, Arc<Value>)],
) -> Result<OpenApiV2, openapi_v2_proto::EncodeError> {
    let remotes: Vec<RemoteSpec<'_>> = specs
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
    let merged = aggregate(core, &remotes);
    let json = Bytes::from(serde_json::to_vec(&merged).unwrap_or_default());
    let protobuf = openapi_v2_proto::encode(&merged)?;
    Ok(OpenApiV2 {
        json_etag: etag_for(&json),
        protobuf_etag: etag_for(&protobuf),
        json,
        protobuf,
    })
}
