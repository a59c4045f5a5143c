//! The request attributes kube-apiserver derives from a URL (its `RequestInfoFactory`): verb,
//! API group and version, resource, subresource, namespace, name, and whether the request is
//! long-running. Timeouts, in-flight limits and authorization all decide on these, so they are
//! parsed once, early, and carried in the request's extensions.

use http::Method;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub is_resource_request: bool,
    pub path: String,
    /// Lowercase: get, list, watch, create, update, patch, delete, deletecollection, proxy; for
    /// non-resource requests the lowercase HTTP method.
    pub verb: String,
    pub api_prefix: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// Exempt from the request timeout and the in-flight limits.
    pub long_running: bool,
}

impl RequestInfo {
    pub fn is_mutating(&self) -> bool {
        !matches!(
            self.verb.as_str(),
            "get" | "list" | "watch" | "head" | "options"
        )
    }
}

const SPECIAL_VERBS: [&str; 2] = ["proxy", "watch"];
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];
const LONG_RUNNING_VERBS: [&str; 2] = ["watch", "proxy"];
const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["attach", "exec", "proxy", "log", "portforward"];

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `metadata.name=foo` (or `metadata.name==foo`) as the only term of a field selector.
pub(crate) fn field_selector_name(query: &str) -> Option<String> {
    let raw = query_param(query, "fieldSelector")?;
    let decoded = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .ok()?
        .replace('+', " ");
    if decoded.contains(',') {
        return None;
    }
    let value = decoded
        .strip_prefix("metadata.name==")
        .or_else(|| decoded.strip_prefix("metadata.name="))?;
    let valid = !value.is_empty() && value != "." && value != ".." && !value.contains(['/', '%']);
    valid.then(|| value.to_owned())
}

/// Parses the attributes of a request. Never fails: a URL that cannot be a resource request is a
/// non-resource request, as in kube-apiserver (the one malformed resource form, `/api/v1/watch`
/// with nothing after it, is reported as `Err` so it gets a 400).
pub fn parse(
    method: &Method,
    path: &str,
    query: &str,
    upgrade: bool,
) -> Result<RequestInfo, String> {
    let mut info = RequestInfo {
        path: path.to_owned(),
        verb: method.as_str().to_ascii_lowercase(),
        long_running: upgrade,
        ..Default::default()
    };
    let mut parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    if parts.len() == 1 && parts[0].is_empty() {
        parts.clear();
    }
    if parts.len() < 3 || !(parts[0] == "api" || parts[0] == "apis") {
        return Ok(info);
    }
    info.api_prefix = parts[0].to_owned();
    let mut rest = &parts[1..];
    if info.api_prefix == "apis" {
        if rest.len() < 3 {
            return Ok(info);
        }
        info.api_group = rest[0].to_owned();
        rest = &rest[1..];
    }
    info.is_resource_request = true;
    info.api_version = rest[0].to_owned();
    rest = &rest[1..];

    if SPECIAL_VERBS.contains(&rest[0]) {
        if rest.len() < 2 {
            return Err(format!(
                "unable to determine kind and namespace from url {path}"
            ));
        }
        info.verb = rest[0].to_owned();
        rest = &rest[1..];
    } else {
        info.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_owned();
    }

    if rest[0] == "namespaces" && rest.len() > 1 {
        info.namespace = rest[1].to_owned();
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        }
    }

    if rest.len() >= 3 && info.verb != "proxy" {
        info.subresource = rest[2].to_owned();
    }
    if rest.len() >= 2 {
        info.name = rest[1].to_owned();
    }
    if !rest.is_empty() {
        info.resource = rest[0].to_owned();
    }

    if info.name.is_empty() && info.verb == "get" {
        let watch = matches!(query_param(query, "watch"), Some("true" | "1"));
        info.verb = if watch { "watch" } else { "list" }.to_owned();
        if let Some(name) = field_selector_name(query) {
            info.name = name;
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".to_owned();
    }
    info.long_running |= LONG_RUNNING_VERBS.contains(&info.verb.as_str())
        || LONG_RUNNING_SUBRESOURCES.contains(&info.subresource.as_str());
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(method: Method, target: &str) -> RequestInfo {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        parse(&method, path, query, false).unwrap()
    }

    #[test]
    fn resource_requests() {
        let i = p(Method::GET, "/api/v1/namespaces/default/pods/web-0");
        assert_eq!(
            (
                i.verb.as_str(),
                i.api_group.as_str(),
                i.api_version.as_str()
            ),
            ("get", "", "v1")
        );
        assert_eq!(
            (i.namespace.as_str(), i.resource.as_str(), i.name.as_str()),
            ("default", "pods", "web-0")
        );
        let i = p(
            Method::GET,
            "/apis/wardle.example.com/v1alpha1/namespaces/ns/flunders",
        );
        assert_eq!(
            (i.verb.as_str(), i.api_group.as_str(), i.resource.as_str()),
            ("list", "wardle.example.com", "flunders")
        );
        let i = p(Method::GET, "/apis/apps/v1/deployments?watch=true");
        assert_eq!(i.verb, "watch");
        assert!(i.long_running);
        let i = p(Method::GET, "/apis/apps/v1/watch/namespaces/x/deployments");
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str(), i.resource.as_str()),
            ("watch", "x", "deployments")
        );
        let i = p(Method::DELETE, "/api/v1/namespaces/x/configmaps");
        assert_eq!(i.verb, "deletecollection");
        let i = p(Method::POST, "/api/v1/namespaces/x/pods/p/exec?command=sh");
        assert_eq!(
            (i.verb.as_str(), i.subresource.as_str()),
            ("create", "exec")
        );
        assert!(i.long_running);
        let i = p(
            Method::PUT,
            "/apis/apiregistration.k8s.io/v1/apiservices/v1.x/status",
        );
        assert_eq!(
            (i.verb.as_str(), i.name.as_str(), i.subresource.as_str()),
            ("update", "v1.x", "status")
        );
        assert!(!i.long_running);
    }

    #[test]
    fn namespaces_themselves() {
        let i = p(Method::GET, "/api/v1/namespaces/default");
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.namespace.as_str()),
            ("namespaces", "default", "default")
        );
        let i = p(Method::PUT, "/api/v1/namespaces/default/finalize");
        assert_eq!(
            (i.resource.as_str(), i.subresource.as_str()),
            ("namespaces", "finalize")
        );
    }

    #[test]
    fn field_selector_names_a_single_object() {
        let i = p(Method::GET, "/apis/apiregistration.k8s.io/v1/apiservices?fieldSelector=metadata.name%3Dv1.x&watch=1");
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("watch", "v1.x"));
    }

    #[test]
    fn non_resource_requests() {
        for path in [
            "/",
            "/apis",
            "/apis/apps",
            "/api",
            "/api/v1",
            "/healthz",
            "/openapi/v3/apis/apps/v1",
            "/version",
        ] {
            let i = p(Method::GET, path);
            assert!(!i.is_resource_request, "{path}");
            assert_eq!(i.verb, "get");
        }
    }

    #[test]
    fn proxy_verb_keeps_the_rest_of_the_path() {
        let i = p(
            Method::GET,
            "/api/v1/proxy/namespaces/x/services/s/some/path",
        );
        assert_eq!(
            (
                i.verb.as_str(),
                i.resource.as_str(),
                i.name.as_str(),
                i.subresource.as_str()
            ),
            ("proxy", "services", "s", "")
        );
        assert!(i.long_running);
    }

    #[test]
    fn bare_watch_prefix_is_an_error() {
        assert!(parse(&Method::GET, "/api/v1/watch", "", false).is_err());
    }

    #[test]
    fn upgrades_are_long_running() {
        assert!(
            parse(&Method::GET, "/fixture/anything", "", true)
                .unwrap()
                .long_running
        );
    }
}
