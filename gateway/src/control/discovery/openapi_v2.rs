//! `/openapi/v2`: the core's Swagger spec merged with every remote APIService's, as
//! kube-aggregator serves it, in JSON and in the protobuf form `kubectl explain` asks for.
//!
//! kube-aggregator's users pay for this in CPU and memory (kubernetes#105932, #101755): it
//! re-merges large specs often. Here one loop owns it ([`OpenApiV2Controller`]):
//! - each spec is revalidated with its ETag every [`REFRESH`], and at once when the routes
//!   change, several backends at a time; a 304 costs nothing;
//! - a spec is kept as the bytes the backend sent, not as a parsed tree (which takes several
//!   times the memory): the merge (`apiservice::discovery::openapi_v2`) parses one remote spec
//!   at a time and drops it once merged;
//! - the merge and the encodings run only when a contributing spec or the APIService set
//!   changed, on a blocking thread, off the request path;
//! - requests read prepared bytes ([`OpenApiV2`]) and answer `If-None-Match` with 304. The gzip
//!   form is made on the first request that accepts it (client-go's transport always does),
//!   once per merged document, so a merge nobody downloads compressed costs no compression.
//!
//! A backend that fails keeps its last spec; one that never answered is left out. Until the
//! core's spec has been fetched once nothing is published, and `/openapi/v2` goes to the core as
//! before.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiservice::discovery::openapi_v2::{aggregate_loading, RemoteSpec};
use apiservice::discovery::{etag_for, openapi_v2_proto};
use apiservice::model::ServiceRef;
use apiservice::outage::Outage;
use bytes::Bytes;
use futures::StreamExt;
use http::StatusCode;
use serde_json::Value;
use tokio::sync::OnceCell;

use super::core_watch::FollowUps;
use super::fetch::{Source, OPENAPI_TIMEOUT};
use super::DiscoveryCache;
use crate::backend::core::CoreBackend;
use crate::body::BoxError;
use crate::control::apiservices::{Routes, Routing, Target};
use crate::metrics::Metrics;

/// How often every spec is revalidated.
pub const REFRESH: Duration = Duration::from_secs(60);
/// The Content-Type of the protobuf form, as kube-openapi answers it. Clients ask for it as
/// `application/com.github.proto-openapi.spec.v2@v1.0+protobuf` (client-go's `OpenAPISchema()`)
/// or with this name; Go's MIME parser refuses the `@` form in a Content-Type.
pub const CONTENT_TYPE_PROTOBUF: &str =
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
const PATH: &str = "/openapi/v2";
/// How many backends are revalidated at once: a slow one holds back only its own slot.
const CONCURRENT_FETCHES: usize = 8;

/// The merged spec as served.
pub struct OpenApiV2 {
    pub json: Encoded,
    pub protobuf: Encoded,
}

// === impl OpenApiV2 ===

impl OpenApiV2 {
    /// The protobuf or the JSON form, with its Content-Type.
    pub fn representation(&self, protobuf: bool) -> (&'static str, &Encoded) {
        if protobuf {
            (CONTENT_TYPE_PROTOBUF, &self.protobuf)
        } else {
            ("application/json", &self.json)
        }
    }
}

/// One representation of the merged spec: its bytes, ETag, and gzip form once asked for.
pub struct Encoded {
    pub bytes: Bytes,
    pub etag: String,
    gzip: OnceCell<Bytes>,
}

// === impl Encoded ===

impl Encoded {
    fn new(bytes: Bytes) -> Self {
        Self {
            etag: etag_for(&bytes),
            bytes,
            gzip: OnceCell::new(),
        }
    }

    /// The gzip form, compressed on a blocking thread by the first caller; callers arriving
    /// meanwhile wait for that one compression instead of starting their own.
    pub async fn gzip(&self) -> Bytes {
        self.gzip
            .get_or_init(|| {
                let bytes = self.bytes.clone();
                async move {
                    tokio::task::spawn_blocking(move || gzip(&bytes))
                        .await
                        .unwrap_or_default()
                }
            })
            .await
            .clone()
    }
}

/// The fastest gzip level: the documents are large and JSON compresses well at any level;
/// a request should not wait seconds for the last few percent.
fn gzip(bytes: &[u8]) -> Bytes {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 8),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(bytes);
    Bytes::from(encoder.finish().unwrap_or_default())
}

/// What one server last said at `/openapi/v2`.
#[derive(Default)]
struct SpecState {
    /// The body as received (a JSON object).
    spec: Option<Bytes>,
    etag: Option<String>,
    /// A remote's last failure, to log changes only (the core's are its [`Outage`]'s).
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

// === impl OpenApiV2Controller ===

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
        let core_outage = Outage::new(
            "OpenAPI v2 fetch of the core",
            "the last fetched spec stays merged",
        );
        let mut remotes: HashMap<ServiceRef, SpecState> = HashMap::new();
        let mut merged_from: Option<Vec<Contributor>> = None;
        let mut core_changes = self.cache.core_changed.subscribe();
        let mut followups = FollowUps::default();
        loop {
            // A CRD event (or a CRD write through the gateway) changes the core's spec a moment
            // later: its own OpenAPI controller runs after the CRD is stored. Only the core is
            // revalidated then, a few times over two seconds, each time a conditional GET.
            let core_only = tokio::select! {
                changed = routes.changed() => if changed.is_err() { return } else { false },
                _ = tick.tick() => false,
                Ok(()) = core_changes.changed() => {
                    followups.start(tokio::time::Instant::now());
                    continue;
                }
                () = followups.next() => true,
            };
            let Some(table) = routes.borrow_and_update().clone() else {
                continue;
            };
            let (contributors, backends) = contributors(&table);
            let mut reasons: Vec<(String, &'static str)> = Vec::new();
            remotes.retain(|svc, _| backends.contains_key(svc));
            // Every server at once (a few at a time): the core as one of them.
            let mut fetches: Vec<(Option<ServiceRef>, Source, String, SpecState)> = vec![(
                None,
                Source::Core(self.core.clone()),
                "core".into(),
                std::mem::take(&mut core),
            )];
            for (svc, backend) in backends.iter().filter(|_| !core_only) {
                let state = remotes.remove(svc).unwrap_or_default();
                let name = backend.name.to_string();
                fetches.push((
                    Some(svc.clone()),
                    Source::Remote(backend.clone()),
                    name,
                    state,
                ));
            }
            let mut done = futures::stream::iter(fetches)
                .map(|(svc, source, name, mut state)| async move {
                    let outcome = refresh(&source, &mut state).await;
                    (svc, name, state, outcome)
                })
                .buffer_unordered(CONCURRENT_FETCHES);
            while let Some((svc, name, mut state, outcome)) = done.next().await {
                match &svc {
                    None => match &outcome {
                        Ok(_) => core_outage.answered(),
                        Err(e) => core_outage.failed(e.as_ref()),
                    },
                    Some(_) => log_remote(&mut state, &name, &outcome),
                }
                if let Ok(Some(reason)) = outcome {
                    reasons.push((name, reason));
                }
                match svc {
                    Some(svc) => {
                        remotes.insert(svc, state);
                    }
                    None => core = state,
                }
            }
            drop(done);
            // The order the fetches finished in is not the metric's business.
            reasons.sort();
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
            let specs: Vec<(Contributor, Bytes)> = contributors
                .iter()
                .filter_map(|c| Some((c.clone(), remotes.get(&c.service)?.spec.clone()?)))
                .collect();
            let started = Instant::now();
            let built = tokio::task::spawn_blocking(move || build(&core_spec, &specs)).await;
            match built {
                Ok(Ok(doc)) => {
                    // The previous document goes with this store (once no request holds it),
                    // and the merge's parsed trees went with `build`: hand the memory back
                    // now rather than at the next periodic trim.
                    self.cache.store_openapi_v2(doc);
                    crate::memory::trim_now().await;
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

/// Revalidates one server's spec: the reason of a change (`add`, `update`, `delete`) or `None`;
/// on failure the last spec stays.
async fn refresh(source: &Source, state: &mut SpecState) -> Refreshed {
    let fetched = source
        .get(
            PATH,
            "application/json",
            state.etag.as_deref(),
            OPENAPI_TIMEOUT,
        )
        .await;
    match fetched {
        Ok(answer) if answer.status == StatusCode::NOT_MODIFIED && state.spec.is_some() => Ok(None),
        Ok(answer) if answer.status == StatusCode::OK => {
            if is_json_object(&answer.body) {
                let reason = match &state.spec {
                    None => Some("add"),
                    Some(old) if *old != answer.body => Some("update"),
                    Some(_) => None,
                };
                state.etag = answer.etag();
                state.spec = Some(answer.body);
                Ok(reason)
            } else {
                Err(format!("GET {PATH}: the body is not a JSON object").into())
            }
        }
        Ok(answer) if answer.status == StatusCode::NOT_FOUND => {
            state.etag = None;
            Ok(state.spec.take().map(|_| "delete"))
        }
        Ok(answer) => Err(format!("GET {PATH}: {}", answer.status).into()),
        Err(e) => Err(e.into()),
    }
}

/// What [`refresh`] found.
type Refreshed = Result<Option<&'static str>, BoxError>;

/// A remote APIService's fetch, logged once per change of its error.
fn log_remote(state: &mut SpecState, name: &str, outcome: &Refreshed) {
    match outcome {
        Ok(_) => {
            if state.error.take().is_some() {
                tracing::info!(apiservice = name, "OpenAPI v2 spec fetched again");
            }
        }
        Err(e) => {
            let e = e.to_string();
            if state.error.as_ref() != Some(&e) {
                tracing::warn!(apiservice = name, error = %e,
                    "cannot fetch the OpenAPI v2 spec; keeping the last one");
                state.error = Some(e);
            }
        }
    }
}

/// Whether `body` is one JSON object, checked without building it.
fn is_json_object(body: &[u8]) -> bool {
    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// The merged document in both forms. Specs are parsed here, one remote at a time.
fn build(
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
    // Both were checked to be JSON objects when fetched.
    let core: Value = serde_json::from_slice(core).unwrap_or_default();
    let merged = aggregate_loading(core, remotes, |spec| serde_json::from_slice(spec).ok());
    let json = Bytes::from(serde_json::to_vec(&merged).unwrap_or_default());
    let protobuf = openapi_v2_proto::encode(&merged)?;
    Ok(OpenApiV2 {
        json: Encoded::new(json),
        protobuf: Encoded::new(protobuf),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn only_json_objects_count_as_specs() {
        assert!(is_json_object(b" {\"swagger\": \"2.0\"}"));
        assert!(!is_json_object(b"[]"));
        assert!(!is_json_object(b"{\"swagger\": "));
        assert!(!is_json_object(b"<html>"));
    }

    #[tokio::test]
    async fn the_gzip_form_is_made_once_and_decodes_to_the_document() {
        let doc = Encoded::new(Bytes::from(vec![b'x'; 100_000]));
        let first = doc.gzip().await;
        assert!(first.len() < 1_000, "{}", first.len());
        let again = doc.gzip().await;
        assert_eq!(first.as_ptr(), again.as_ptr(), "compressed once");
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&first[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, doc.bytes);
    }
}
