//! kube-apiserver's request labels (`verb`, `dry_run`, `group`, `version`, `resource`,
//! `subresource`, `scope`, `system_client`), worked out once per request the way
//! `k8s.io/apiserver/pkg/endpoints/metrics` works them out, so kube-apiserver's dashboards and
//! alert rules select the gateway's series unchanged.
//!
//! Every value comes from a closed set: the verb from kube's list of reported verbs, names from
//! what discovery lists ([`KnownResources`]), everything else `other` or empty. A request is
//! labelled before anyone has authenticated it, so nothing a client writes may become a label
//! value of its own.

use std::sync::{Arc, LazyLock};

use http::header::{CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, Method};

use super::known_resources::{KnownResources, ResourceLabels, OTHER};
use crate::request_info::{go_unescape, parse, RequestInfo};

/// The verbs kube reports; anything else is `other`.
const REPORTED_VERBS: [&str; 14] = [
    "APPLY",
    "CONNECT",
    "CREATE",
    "DELETE",
    "DELETECOLLECTION",
    "GET",
    "LIST",
    "PATCH",
    "POST",
    "PROXY",
    "PUT",
    "UPDATE",
    "WATCH",
    "WATCHLIST",
];

/// Subresources kube reports as `CONNECT` whatever the HTTP method.
const CONNECT_SUBRESOURCES: [&str; 5] = ["log", "exec", "portforward", "attach", "proxy"];

/// Clients kube names in `system_client` (the `User-Agent` up to its first `/`).
const SYSTEM_CLIENTS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// The non-resource paths named in the `subresource` label, as kube names a non-resource path
/// there; any other path is `other`.
const NON_RESOURCE_PATHS: [&str; 10] = [
    "/api",
    "/apis",
    "/healthz",
    "/livez",
    "/readyz",
    "/metrics",
    "/version",
    "/openapi/v2",
    "/openapi/v3",
    "/",
];

/// [`NON_RESOURCE_PATHS`] as shared label values, made once.
static NON_RESOURCE_LABELS: LazyLock<Vec<Arc<str>>> =
    LazyLock::new(|| NON_RESOURCE_PATHS.iter().map(|p| Arc::from(*p)).collect());
static OTHER_PATH: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(OTHER));

/// `Content-Type` of a server-side apply patch: such a PATCH is reported as `APPLY`.
const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// The labels of one request. Cheap to clone: names are shared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLabels {
    pub verb: &'static str,
    pub dry_run: &'static str,
    pub names: ResourceLabels,
    pub scope: &'static str,
    pub system_client: &'static str,
}

impl RequestLabels {
    /// The labels of a request with this method, path, query and headers.
    pub fn of(
        method: &Method,
        path: &str,
        query: &str,
        headers: &HeaderMap,
        known: &KnownResources,
    ) -> Self {
        Self::of_parsed(
            method,
            parse(method, path, query).as_ref().ok(),
            query,
            headers,
            known,
        )
    }

    /// The labels of a request whose attributes are already parsed (`None`: its URL was
    /// refused).
    pub fn of_parsed(
        method: &Method,
        info: Option<&RequestInfo>,
        query: &str,
        headers: &HeaderMap,
        known: &KnownResources,
    ) -> Self {
        let system_client = system_client(headers);
        let dry_run = dry_run(query);
        // A path kube would refuse (a bad escape) is labelled by its method alone: the request
        // is answered 400 further down.
        let Some(info) = info else {
            return Self {
                verb: reported(method.as_str()),
                dry_run,
                names: ResourceLabels::empty(),
                scope: "",
                system_client,
            };
        };
        let scope = scope(info);
        Self {
            verb: verb(method, info, scope, headers),
            dry_run,
            names: names(info, known),
            scope,
            system_client,
        }
    }
}

/// kube's `CleanScope`.
fn scope(info: &RequestInfo) -> &'static str {
    if !info.name().is_empty() || info.verb() == "create" {
        "resource"
    } else if !info.namespace().is_empty() {
        "namespace"
    } else if info.is_resource_request {
        "cluster"
    } else {
        ""
    }
}

/// kube's `CanonicalVerb` then `CleanVerb`: the HTTP method, with GET of a collection as LIST,
/// a watch as WATCH, a server-side apply as APPLY and the streaming subresources as CONNECT.
fn verb(method: &Method, info: &RequestInfo, scope: &str, headers: &HeaderMap) -> &'static str {
    if info.is_resource_request && CONNECT_SUBRESOURCES.contains(&info.subresource()) {
        return "CONNECT";
    }
    if *method == Method::GET || *method == Method::HEAD {
        if info.verb() == "watch" {
            return "WATCH";
        }
        return if scope == "resource" || scope.is_empty() {
            "GET"
        } else {
            "LIST"
        };
    }
    if *method == Method::PATCH
        && headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes() == APPLY_PATCH.as_bytes())
    {
        return "APPLY";
    }
    reported(method.as_str())
}

/// `method` when kube reports it under that name, `other` otherwise (kube compares the
/// uppercase form).
fn reported(method: &str) -> &'static str {
    REPORTED_VERBS
        .iter()
        .find(|v| v.eq_ignore_ascii_case(method))
        .copied()
        .unwrap_or(OTHER)
}

/// Group, version, resource and subresource as discovery knows them; for a non-resource request
/// only the path, when it is one of a few well-known ones.
fn names(info: &RequestInfo, known: &KnownResources) -> ResourceLabels {
    if info.is_resource_request {
        return known.labels(
            info.api_group(),
            info.api_version(),
            info.resource(),
            info.subresource(),
        );
    }
    let path = info.path().trim_end_matches('/');
    let path = if path.is_empty() { "/" } else { path };
    let label = NON_RESOURCE_PATHS
        .iter()
        .position(|p| *p == path)
        .map_or_else(|| OTHER_PATH.clone(), |i| NON_RESOURCE_LABELS[i].clone());
    ResourceLabels {
        subresource: label,
        ..ResourceLabels::empty()
    }
}

/// kube's `cleanDryRun`: `""` without `dryRun`, `All` when every value is `All` (the only
/// valid one), `invalid` otherwise.
fn dry_run(query: &str) -> &'static str {
    if !query.contains("dryRun") {
        return "";
    }
    let mut seen = false;
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(key) = go_unescape(key, true) else {
            continue;
        };
        if &*key != b"dryRun" {
            continue;
        }
        seen = true;
        if go_unescape(value, true).as_deref() != Some(b"All".as_slice()) {
            return "invalid";
        }
    }
    if seen {
        "All"
    } else {
        ""
    }
}

/// kube's `system_client`: the `User-Agent` product of a control-plane component, else `""`.
fn system_client(headers: &HeaderMap) -> &'static str {
    let Some((product, _)) = headers
        .get(USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split_once('/'))
    else {
        return "";
    };
    SYSTEM_CLIENTS
        .iter()
        .find(|c| **c == product)
        .copied()
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn known() -> KnownResources {
        let doc = serde_json::json!({
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "items": [{
                "metadata": {"name": ""},
                "versions": [{"version": "v1", "resources": [
                    {"resource": "pods", "scope": "Namespaced", "verbs": ["get"],
                     "responseKind": {"group": "", "version": "v1", "kind": "Pod"},
                     "subresources": [{"subresource": "exec", "verbs": ["get"]},
                                      {"subresource": "status", "verbs": ["get"]}]},
                    {"resource": "namespaces", "scope": "Cluster", "verbs": ["get"],
                     "responseKind": {"group": "", "version": "v1", "kind": "Namespace"}}
                ]}]
            }]
        })
        .to_string();
        KnownResources::from_aggregated([doc.as_bytes()])
    }

    fn labels(method: &str, uri: &str, headers: &[(&str, &str)]) -> RequestLabels {
        let uri: http::Uri = uri.parse().unwrap();
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        RequestLabels::of(
            &Method::from_bytes(method.as_bytes()).unwrap(),
            uri.path(),
            uri.query().unwrap_or(""),
            &map,
            &known(),
        )
    }

    #[test]
    fn verbs_are_reported_as_kube_reports_them() {
        let cases = [
            (
                "GET",
                "/api/v1/namespaces/a/pods",
                vec![],
                "LIST",
                "namespace",
            ),
            ("GET", "/api/v1/pods", vec![], "LIST", "cluster"),
            (
                "GET",
                "/api/v1/namespaces/a/pods/p",
                vec![],
                "GET",
                "resource",
            ),
            (
                "HEAD",
                "/api/v1/namespaces/a/pods/p",
                vec![],
                "GET",
                "resource",
            ),
            (
                "GET",
                "/api/v1/namespaces/a/pods?watch=true",
                vec![],
                "WATCH",
                "namespace",
            ),
            (
                "GET",
                "/api/v1/watch/namespaces/a/pods",
                vec![],
                "WATCH",
                "namespace",
            ),
            (
                "POST",
                "/api/v1/namespaces/a/pods",
                vec![],
                "POST",
                "resource",
            ),
            (
                "PUT",
                "/api/v1/namespaces/a/pods/p",
                vec![],
                "PUT",
                "resource",
            ),
            (
                "DELETE",
                "/api/v1/namespaces/a/pods",
                vec![],
                "DELETE",
                "namespace",
            ),
            (
                "PATCH",
                "/api/v1/namespaces/a/pods/p",
                vec![("content-type", "application/merge-patch+json")],
                "PATCH",
                "resource",
            ),
            (
                "PATCH",
                "/api/v1/namespaces/a/pods/p",
                vec![("content-type", APPLY_PATCH)],
                "APPLY",
                "resource",
            ),
            (
                "POST",
                "/api/v1/namespaces/a/pods/p/exec",
                vec![],
                "CONNECT",
                "resource",
            ),
            ("GET", "/api/v1/namespaces/a", vec![], "GET", "resource"),
            ("GET", "/healthz", vec![], "GET", ""),
            ("OPTIONS", "/api/v1/pods", vec![], "other", "cluster"),
            ("BREW", "/api/v1/pods", vec![], "other", "cluster"),
            ("BREW", "/%zz", vec![], "other", ""),
        ];
        for (method, uri, headers, verb, scope) in cases {
            let l = labels(method, uri, &headers);
            assert_eq!((l.verb, l.scope), (verb, scope), "{method} {uri}");
        }
    }

    #[test]
    fn names_come_from_discovery_or_a_fixed_list() {
        let l = labels("GET", "/api/v1/namespaces/a/pods/p/status", &[]);
        assert_eq!(
            (
                &*l.names.group,
                &*l.names.version,
                &*l.names.resource,
                &*l.names.subresource
            ),
            ("", "v1", "pods", "status")
        );
        let l = labels("GET", "/apis/made.up/v1/namespaces/a/things", &[]);
        assert_eq!(&*l.names.resource, OTHER);
        let l = labels("GET", "/readyz/", &[]);
        assert_eq!(&*l.names.subresource, "/readyz");
        let l = labels("GET", "/some/made/up/path", &[]);
        assert_eq!(&*l.names.subresource, OTHER);
    }

    #[test]
    fn dry_run_and_system_client_are_closed_sets() {
        assert_eq!(
            labels("POST", "/api/v1/namespaces/a/pods?dryRun=All", &[]).dry_run,
            "All"
        );
        assert_eq!(
            labels("POST", "/api/v1/namespaces/a/pods?dryRun=Maybe", &[]).dry_run,
            "invalid"
        );
        assert_eq!(labels("POST", "/api/v1/namespaces/a/pods", &[]).dry_run, "");
        let ua = |v: &str| labels("GET", "/api/v1/pods", &[("user-agent", v)]).system_client;
        assert_eq!(ua("kube-scheduler/v1.33.0 (linux/amd64)"), "kube-scheduler");
        assert_eq!(ua("kubectl/v1.33.0 (linux/amd64)"), "");
        assert_eq!(ua("kube-scheduler"), "");
    }
}
