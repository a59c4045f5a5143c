//! The request attributes kube-apiserver derives from a URL (its `RequestInfoFactory`): verb,
//! API group and version, resource, subresource, namespace, name, and whether the request is
//! long-running. Timeouts, in-flight limits and authorization all decide on these, so they are
//! parsed once, early, and carried in the request's extensions.
//!
//! The gateway must read a URL exactly as the Go server behind it will: any difference is a
//! request authorized (or limited) as one thing and served as another. So the path is
//! percent-decoded before it is split (Go's `URL.Path`), and query parameters are read as Go's
//! `url.Values` reads them.

use std::borrow::Cow;
use std::sync::Arc;

use http::Method;

/// A request's attributes. They cost one allocation: the decoded path (followed by the name a
/// field selector gave and the selectors authorization reads, if any) is kept once and every
/// other field is a span of it or one of kube's verbs, which are constants.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub is_resource_request: bool,
    /// Exempt from the request timeout and the in-flight limits. Decided by verb and
    /// subresource alone: a header such as `Connection: Upgrade` costs a client nothing to send.
    pub long_running: bool,
    /// The decoded path, then the field selector's name (see [`RequestInfo::name`]) and the
    /// raw selectors (see [`RequestInfo::label_selector`]).
    text: String,
    path_len: usize,
    verb: Cow<'static, str>,
    api_prefix: Span,
    api_group: Span,
    api_version: Span,
    namespace: Span,
    resource: Span,
    subresource: Span,
    name: Span,
    label_selector: Span,
    field_selector: Span,
}

/// Where a field lies in [`RequestInfo`]'s text (empty: the field is not set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Span {
    start: usize,
    end: usize,
}

impl Span {
    fn is_empty(self) -> bool {
        self.start == self.end
    }

    /// The span of `part`, a slice of `text`.
    fn of(text: &str, part: &str) -> Self {
        let start = part.as_ptr() as usize - text.as_ptr() as usize;
        Self {
            start,
            end: start + part.len(),
        }
    }
}

impl RequestInfo {
    /// A non-resource request for `path`, for a request no one parsed (tests, fallbacks).
    pub fn non_resource(method: &Method, path: &str) -> Self {
        Self {
            path_len: path.len(),
            text: path.to_owned(),
            verb: lowercase_method(method),
            ..Default::default()
        }
    }

    fn field(&self, span: Span) -> &str {
        &self.text[span.start..span.end]
    }

    /// The percent-decoded URL path, as kube's `RequestInfo.Path` (Go's `URL.Path`); the raw
    /// form stays in the request's URI.
    pub fn path(&self) -> &str {
        &self.text[..self.path_len]
    }

    /// Lowercase: get, list, watch, create, update, patch, delete, deletecollection, proxy; for
    /// non-resource requests the lowercase HTTP method.
    pub fn verb(&self) -> &str {
        &self.verb
    }

    pub fn api_prefix(&self) -> &str {
        self.field(self.api_prefix)
    }

    pub fn api_group(&self) -> &str {
        self.field(self.api_group)
    }

    pub fn api_version(&self) -> &str {
        self.field(self.api_version)
    }

    pub fn namespace(&self) -> &str {
        self.field(self.namespace)
    }

    pub fn resource(&self) -> &str {
        self.field(self.resource)
    }

    pub fn subresource(&self) -> &str {
        self.field(self.subresource)
    }

    /// The object's name, from the path or from a field selector naming a single object.
    pub fn name(&self) -> &str {
        self.field(self.name)
    }

    /// The `labelSelector` parameter as given (decoded), for a list, watch or deletecollection
    /// whose verb is not in the path: kube's `RequestInfo.LabelSelector` with
    /// `AuthorizeWithSelectors` (on since 1.32, GA in 1.34), which authorization narrows its
    /// question by. Empty otherwise.
    pub fn label_selector(&self) -> &str {
        self.field(self.label_selector)
    }

    /// The `fieldSelector` parameter as given, on the same terms as
    /// [`RequestInfo::label_selector`].
    pub fn field_selector(&self) -> &str {
        self.field(self.field_selector)
    }

    /// kube's split for the in-flight limits and their gauge: only get, list and watch read.
    /// A HEAD or OPTIONS outside the resource paths keeps its own verb and so counts as mutating
    /// there too (a HEAD on a resource is already a get).
    pub fn is_mutating(&self) -> bool {
        !matches!(self.verb(), "get" | "list" | "watch")
    }
}

impl std::fmt::Debug for RequestInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestInfo")
            .field("is_resource_request", &self.is_resource_request)
            .field("path", &self.path())
            .field("verb", &self.verb())
            .field("api_prefix", &self.api_prefix())
            .field("api_group", &self.api_group())
            .field("api_version", &self.api_version())
            .field("namespace", &self.namespace())
            .field("resource", &self.resource())
            .field("subresource", &self.subresource())
            .field("name", &self.name())
            .field("label_selector", &self.label_selector())
            .field("field_selector", &self.field_selector())
            .field("long_running", &self.long_running)
            .finish()
    }
}

/// The lowercase HTTP method, kube's verb of a non-resource request; a constant for the
/// standard methods.
fn lowercase_method(method: &Method) -> Cow<'static, str> {
    match *method {
        Method::GET => "get".into(),
        Method::HEAD => "head".into(),
        Method::POST => "post".into(),
        Method::PUT => "put".into(),
        Method::PATCH => "patch".into(),
        Method::DELETE => "delete".into(),
        Method::OPTIONS => "options".into(),
        Method::CONNECT => "connect".into(),
        Method::TRACE => "trace".into(),
        _ => method.as_str().to_ascii_lowercase().into(),
    }
}

const SPECIAL_VERBS: [&str; 2] = ["proxy", "watch"];
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];
const LONG_RUNNING_VERBS: [&str; 2] = ["watch", "proxy"];
const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["attach", "exec", "proxy", "log", "portforward"];

/// Go's `url.ParseQuery` gives up on a query with more parameters than this and returns none
/// (recent Go releases; older ones parse them all).
pub const MAX_QUERY_PARAMS: usize = 10_000;

/// Percent-decodes `s` as Go's `url.PathUnescape` (`plus_is_space` false) or
/// `url.QueryUnescape` (true) do: `None` when a `%` is not followed by two hex digits, where Go
/// fails too. The bytes need not be UTF-8.
pub fn go_unescape(s: &str, plus_is_space: bool) -> Option<Cow<'_, [u8]>> {
    let bytes = s.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return None;
        }
    }
    if plus_is_space && s.contains('+') {
        let spaced = s.replace('+', " ");
        return Some(Cow::Owned(
            percent_encoding::percent_decode_str(&spaced).collect(),
        ));
    }
    Some(percent_encoding::percent_decode_str(s).into())
}

/// The first value of `key` in a raw query string, as Go's `url.Values.Get` sees it: keys and
/// values are decoded (`+` is a space), and a pair that Go drops (one containing `;`, or with a
/// malformed escape in its key or value) is skipped rather than taken as the first value.
pub fn query_value<'a>(query: &'a str, key: &str) -> Option<Cow<'a, [u8]>> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.contains(';'))
        .find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = go_unescape(k, true)?;
            if *k != *key.as_bytes() {
                return None;
            }
            go_unescape(v, true)
        })
}

/// `ListOptions.Watch` as kube decodes it (apimachinery's `Convert_Slice_string_To_bool`): a
/// present `watch` parameter is true unless its first value is `0` or, in any case, `false`;
/// `?watch` and `?watch=` are watches.
pub fn watch_requested(query: &str) -> bool {
    query_value(query, "watch").is_some_and(|v| !(v.eq_ignore_ascii_case(b"false") || *v == *b"0"))
}

/// `metadata.name=foo` (or `metadata.name==foo`) as the only term of a field selector. Where
/// kube's reading could differ from this one (escapes, several terms, names kube would refuse)
/// there is no name: authorization then covers the whole collection, which is the stricter
/// check.
pub fn field_selector_name(query: &str) -> Option<String> {
    let raw = query_value(query, "fieldSelector")?;
    let decoded = std::str::from_utf8(&raw).ok()?;
    let value = decoded
        .strip_prefix("metadata.name==")
        .or_else(|| decoded.strip_prefix("metadata.name="))?;
    let valid = !value.is_empty()
        && value != "."
        && value != ".."
        && !value.contains(['/', '%', ',', '=', '\\']);
    valid.then(|| value.to_owned())
}

/// The path every decision about `req` is made on and every handler of the gateway's own
/// answers by: the decoded path of its attributes (Go's `URL.Path`, the one path kube-apiserver's
/// FlowSchema matching, authorization and mux all read), or the raw path of a request no layer
/// parsed (a layer's unit tests). Deciding on one form and answering on the other is how
/// `/%68ealthz/../api/...` was classified as a probe (exempt) yet sent on to the core.
pub fn decided_path<B>(req: &http::Request<B>) -> &str {
    req.extensions()
        .get::<Arc<RequestInfo>>()
        .map_or(req.uri().path(), |info| info.path())
}

/// Why [`parse`] refused a request, kept in its extensions by the first layer that parsed it
/// (the access log, for the metric labels) for the request-info layer below to answer.
#[derive(Clone)]
pub struct Unparsable(pub String);

/// Parses `req` unless an outer layer already did, and leaves the result in its extensions:
/// the attributes themselves, as the layers below read them (the request-info layer only adds
/// what the routes declare long-running), or why there are none. One extension either way, so
/// the parse costs no extension of its own. Nothing between the two layers rewrites the URI.
/// Returns whether the request has attributes.
pub fn ensure_parsed<B>(req: &mut http::Request<B>) -> bool {
    if req.extensions().get::<Arc<RequestInfo>>().is_some() {
        return true;
    }
    if req.extensions().get::<Unparsable>().is_some() {
        return false;
    }
    let parsed = parse(
        req.method(),
        req.uri().path(),
        req.uri().query().unwrap_or(""),
    );
    match parsed {
        Ok(info) => {
            req.extensions_mut().insert(Arc::new(info));
            true
        }
        Err(message) => {
            req.extensions_mut().insert(Unparsable(message));
            false
        }
    }
}

/// Parses the attributes of a request from its method and its raw (still percent-encoded) path
/// and query. A URL that cannot be a resource request is a non-resource request, as in
/// kube-apiserver. `Err` (answered 400) for what the Go server behind would not parse the same
/// way: a malformed escape or non-UTF-8 bytes in the path, the one malformed resource form
/// (`/api/v1/watch` with nothing after it), and a list whose query has more parameters than
/// Go reads.
pub fn parse(method: &Method, raw_path: &str, query: &str) -> Result<RequestInfo, String> {
    let path = match go_unescape(raw_path, false) {
        Some(Cow::Borrowed(_)) => Cow::Borrowed(raw_path),
        Some(Cow::Owned(bytes)) => Cow::Owned(
            String::from_utf8(bytes)
                .map_err(|_| format!("invalid UTF-8 in URL path {raw_path:?}"))?,
        ),
        None => return Err(format!("invalid URL escape in path {raw_path:?}")),
    };
    let mut info = RequestInfo {
        path_len: path.len(),
        verb: lowercase_method(method),
        ..Default::default()
    };
    let from_query = split(&mut info, &path, raw_path, method, query)?;
    info.text = path.into_owned();
    let append = |text: &mut String, value: &str| {
        let start = text.len();
        text.push_str(value);
        Span {
            start,
            end: text.len(),
        }
    };
    if let Some(name) = from_query.name {
        info.name = append(&mut info.text, &name);
    }
    if let Some(label) = from_query.label_selector {
        info.label_selector = append(&mut info.text, &label);
    }
    if let Some(field) = from_query.field_selector {
        info.field_selector = append(&mut info.text, &field);
    }
    info.long_running = is_long_running(&info);
    Ok(info)
}

/// Kube's parts of a path beyond which [`split`] never looks: it compares what is left after at
/// most six parts with at most three.
const MAX_PARTS: usize = 10;

/// What [`split`] reads from the query rather than the path.
#[derive(Default)]
struct FromQuery {
    /// The name a field selector gives a list.
    name: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
}

/// Sets `info`'s verb and the spans of its fields in the decoded `path` (the rest of
/// [`parse`]); returns what the query adds.
fn split(
    info: &mut RequestInfo,
    path: &str,
    raw_path: &str,
    method: &Method,
    query: &str,
) -> Result<FromQuery, String> {
    let mut all = [""; MAX_PARTS];
    let mut n = 0;
    for (slot, part) in all.iter_mut().zip(path.trim_matches('/').split('/')) {
        *slot = part;
        n += 1;
    }
    let mut parts = &all[..n];
    if parts.len() == 1 && parts[0].is_empty() {
        parts = &[];
    }
    if parts.len() < 3 || !(parts[0] == "api" || parts[0] == "apis") {
        return Ok(FromQuery::default());
    }
    let span = |part: &str| Span::of(path, part);
    info.api_prefix = span(parts[0]);
    let mut rest = &parts[1..];
    if parts[0] == "apis" {
        if rest.len() < 3 {
            return Ok(FromQuery::default());
        }
        info.api_group = span(rest[0]);
        rest = &rest[1..];
    }
    info.is_resource_request = true;
    info.api_version = span(rest[0]);
    rest = &rest[1..];

    let verb_in_path = SPECIAL_VERBS.contains(&rest[0]);
    if let Some(special) = SPECIAL_VERBS.iter().find(|v| **v == rest[0]) {
        if rest.len() < 2 {
            return Err(format!(
                "unable to determine kind and namespace from url {raw_path}"
            ));
        }
        info.verb = Cow::Borrowed(special);
        rest = &rest[1..];
    } else {
        info.verb = Cow::Borrowed(match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        });
    }

    if rest[0] == "namespaces" && rest.len() > 1 {
        info.namespace = span(rest[1]);
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        }
    }

    if rest.len() >= 3 && info.verb != "proxy" {
        info.subresource = span(rest[2]);
    }
    if rest.len() >= 2 {
        info.name = span(rest[1]);
    }
    if !rest.is_empty() {
        info.resource = span(rest[0]);
    }

    let mut out = FromQuery::default();
    let too_many_params = query.split('&').count() > MAX_QUERY_PARAMS;
    if info.name.is_empty() && info.verb == "get" {
        // Past Go's limit the backend sees no parameters at all (no watch, no selector) while
        // older Go releases see them all: refuse rather than guess which one serves this.
        if too_many_params {
            return Err(format!(
                "number of URL query parameters exceeded limit of {MAX_QUERY_PARAMS}"
            ));
        }
        info.verb = Cow::Borrowed(if watch_requested(query) {
            "watch"
        } else {
            "list"
        });
        out.name = field_selector_name(query);
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = Cow::Borrowed("deletecollection");
    }
    // kube reads the selectors for authorization only for these verbs, and not on the old
    // `/watch/` paths, whose single-object form takes none. The first value of each, as Go's
    // `URL.Query()` gives it; past Go's parameter limit the backend sees no selector (and a
    // deletecollection all objects), so authorization must not be narrowed by one either.
    if !verb_in_path
        && !too_many_params
        && matches!(&*info.verb, "list" | "watch" | "deletecollection")
    {
        let value = |key| {
            query_value(query, key)
                .filter(|v| !v.is_empty())
                .map(|v| String::from_utf8_lossy(&v).into_owned())
        };
        out.label_selector = value("labelSelector");
        out.field_selector = value("fieldSelector");
    }
    Ok(out)
}

/// kube-apiserver's `BasicLongRunningRequestCheck` over its default verbs and subresources,
/// except that a non-resource request is never long-running: its verb is just the HTTP method,
/// and a made-up `WATCH` method must not buy an exemption from the limits.
fn is_long_running(info: &RequestInfo) -> bool {
    info.is_resource_request
        && (LONG_RUNNING_VERBS.contains(&info.verb())
            || LONG_RUNNING_SUBRESOURCES.contains(&info.subresource()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(method: Method, target: &str) -> RequestInfo {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        parse(&method, path, query).unwrap()
    }

    fn verb(target: &str) -> String {
        p(Method::GET, target).verb().to_owned()
    }

    /// kube's `RequestInfo` keeps the selectors of a list, watch or deletecollection (first
    /// value, decoded) for authorization, and of nothing else.
    #[test]
    fn selectors_are_kept_for_lists_watches_and_deletecollections_only() {
        let q = "labelSelector=app%3Dweb%2Ctier+in+(a)&labelSelector=x&fieldSelector=metadata.name%3Df1";
        let sel = |m: Method, path: &str| {
            let i = p(m, &format!("{path}?{q}"));
            (
                i.verb().to_owned(),
                i.label_selector().to_owned(),
                i.field_selector().to_owned(),
            )
        };
        let pods = "/api/v1/namespaces/default/pods";
        let kept = |verb: &str| {
            (
                verb.to_owned(),
                "app=web,tier in (a)".to_owned(),
                "metadata.name=f1".to_owned(),
            )
        };
        assert_eq!(sel(Method::GET, pods), kept("list"));
        assert_eq!(sel(Method::DELETE, pods), kept("deletecollection"));
        let i = p(Method::GET, &format!("{pods}?watch=1&{q}"));
        assert_eq!((i.verb(), i.name()), ("watch", "f1"));
        assert_eq!(i.label_selector(), "app=web,tier in (a)");
        for (m, path) in [
            (Method::GET, "/api/v1/namespaces/default/pods/p1"),
            (Method::POST, pods),
            (Method::GET, "/api/v1/watch/namespaces/default/pods"),
            (Method::GET, "/api/v1/proxy/namespaces/default/pods/p1"),
            (Method::GET, "/apis"),
        ] {
            let (_, label, field) = sel(m.clone(), path);
            assert_eq!((label.as_str(), field.as_str()), ("", ""), "{m} {path}");
        }
        // An empty first value is no selector; past Go's parameter limit there is none either.
        assert_eq!(
            p(
                Method::GET,
                &format!("{pods}?labelSelector=&labelSelector=a")
            )
            .label_selector(),
            ""
        );
        let many = format!("{pods}?labelSelector=a{}", "&x".repeat(MAX_QUERY_PARAMS));
        assert_eq!(p(Method::DELETE, &many).label_selector(), "");
    }

    #[test]
    fn resource_requests() {
        let i = p(Method::GET, "/api/v1/namespaces/default/pods/web-0");
        assert_eq!(
            (i.verb(), i.api_group(), i.api_version()),
            ("get", "", "v1")
        );
        assert_eq!(
            (i.namespace(), i.resource(), i.name()),
            ("default", "pods", "web-0")
        );
        let i = p(
            Method::GET,
            "/apis/wardle.example.com/v1alpha1/namespaces/ns/flunders",
        );
        assert_eq!(
            (i.verb(), i.api_group(), i.resource()),
            ("list", "wardle.example.com", "flunders")
        );
        assert!(!i.long_running);
        let i = p(Method::GET, "/apis/apps/v1/deployments?watch=true");
        assert_eq!(i.verb(), "watch");
        assert!(i.long_running);
        let i = p(Method::GET, "/apis/apps/v1/watch/namespaces/x/deployments");
        assert_eq!(
            (i.verb(), i.namespace(), i.resource()),
            ("watch", "x", "deployments")
        );
        let i = p(Method::DELETE, "/api/v1/namespaces/x/configmaps");
        assert_eq!(i.verb(), "deletecollection");
        let i = p(Method::POST, "/api/v1/namespaces/x/pods/p/exec?command=sh");
        assert_eq!((i.verb(), i.subresource()), ("create", "exec"));
        assert!(i.long_running);
        let i = p(
            Method::PUT,
            "/apis/apiregistration.k8s.io/v1/apiservices/v1.x/status",
        );
        assert_eq!(
            (i.verb(), i.name(), i.subresource()),
            ("update", "v1.x", "status")
        );
        assert!(!i.long_running);
    }

    #[test]
    fn watch_parameter_is_read_as_kube_decodes_list_options() {
        for target in [
            "/api/v1/pods?watch",
            "/api/v1/pods?watch=",
            "/api/v1/pods?watch=true",
            "/api/v1/pods?watch=TRUE",
            "/api/v1/pods?watch=1",
            "/api/v1/pods?watch=yes",
            "/api/v1/pods?watch=%74rue",
            "/api/v1/pods?watch=+",
            "/api/v1/pods?watch=0+",
            "/api/v1/pods?watch=false+",
            "/api/v1/pods?%77atch=1",
            "/api/v1/pods?limit=5&&watch&resourceVersion=0",
            "/api/v1/pods?watch=true&watch=false",
            // Go drops a pair with a malformed escape or a `;`; the next one is the first value.
            "/api/v1/pods?watch=%zz&watch=1",
            "/api/v1/pods?watch=0;x=1&watch=1",
        ] {
            let i = p(Method::GET, target);
            assert_eq!(i.verb(), "watch", "{target}");
            assert!(i.long_running, "{target}");
        }
        for target in [
            "/api/v1/pods",
            "/api/v1/pods?watch=false",
            "/api/v1/pods?watch=FaLsE",
            "/api/v1/pods?watch=0",
            "/api/v1/pods?watch=%66alse",
            "/api/v1/pods?watch=%30",
            "/api/v1/pods?watch=false&watch=true",
            "/api/v1/pods?watch=%zz&watch=false",
            "/api/v1/pods?watch=1;x=1&watch=0",
            "/api/v1/pods?watchx=1&xwatch=1",
            "/api/v1/pods?%77atch%3D1",
        ] {
            let i = p(Method::GET, target);
            assert_eq!(i.verb(), "list", "{target}");
            assert!(!i.long_running, "{target}");
        }
        // HEAD reads like GET; a named object is a get whatever `watch` says.
        assert_eq!(p(Method::HEAD, "/api/v1/pods?watch=yes").verb, "watch");
        assert_eq!(verb("/api/v1/namespaces/x/pods/p?watch=1"), "get");
    }

    #[test]
    fn a_query_past_gos_parameter_limit_is_refused_for_lists() {
        let many = "a=1&".repeat(MAX_QUERY_PARAMS) + "watch=1";
        assert!(parse(&Method::GET, "/api/v1/pods", &many).is_err());
        let at_limit = "a=1&".repeat(MAX_QUERY_PARAMS - 1) + "watch=1";
        assert_eq!(
            parse(&Method::GET, "/api/v1/pods", &at_limit).unwrap().verb,
            "watch"
        );
        // Only the list/watch decision reads the query.
        assert!(parse(&Method::GET, "/api/v1/namespaces/x/pods/p", &many).is_ok());
        assert!(parse(&Method::GET, "/healthz", &many).is_ok());
    }

    #[test]
    fn the_path_is_decoded_before_it_is_split() {
        let i = p(Method::GET, "/api/v1/namespaces/%6Bube-system/pods");
        assert_eq!(
            (i.namespace(), i.resource(), i.verb()),
            ("kube-system", "pods", "list")
        );
        assert_eq!(i.path(), "/api/v1/namespaces/kube-system/pods");
        // An encoded slash is a separator in Go's `URL.Path`, so in kube's parts too.
        let i = p(Method::GET, "/api/v1/namespaces/a%2Fb/pods");
        assert_eq!((i.namespace(), i.resource(), i.name()), ("a", "b", "pods"));
        assert_eq!(i.path(), "/api/v1/namespaces/a/b/pods");
        let i = p(Method::GET, "/%61pis/apps/v1/%77atch/deployments");
        assert_eq!(
            (i.api_prefix(), i.verb(), i.resource()),
            ("apis", "watch", "deployments")
        );
        assert!(i.long_running);
        let i = p(Method::POST, "/api/v1/namespaces/x/pods/p/%65xec");
        assert_eq!(i.subresource(), "exec");
        assert!(i.long_running);
        // `+` is only a space in queries; `%2B` is a plus, `%C3%A9` UTF-8.
        let i = p(Method::GET, "/api/v1/namespaces/x/configmaps/a+b%2Bc%C3%A9");
        assert_eq!(i.name(), "a+b+cé");
        let i = p(Method::GET, "/heal%74hz");
        assert!(!i.is_resource_request);
        assert_eq!(i.path(), "/healthz");
        assert_eq!(p(Method::GET, "/api/v1/pods").path(), "/api/v1/pods");
    }

    #[test]
    fn decisions_read_the_decoded_path_once_it_is_parsed() {
        let mut req = http::Request::get("/%68ealthz/../api/v1/namespaces/default/configmaps")
            .body(())
            .unwrap();
        assert_eq!(
            decided_path(&req),
            "/%68ealthz/../api/v1/namespaces/default/configmaps",
            "unparsed: the raw path"
        );
        assert!(ensure_parsed(&mut req));
        // Go's `URL.Path`: decoded once, dot segments kept (kube's handlers never clean them).
        assert_eq!(
            decided_path(&req),
            "/healthz/../api/v1/namespaces/default/configmaps"
        );
        let info = p(
            Method::GET,
            "/%68ealthz/../api/v1/namespaces/default/configmaps",
        );
        assert!(
            !info.is_resource_request,
            "kube's RequestInfo: a non-resource path"
        );
    }

    #[test]
    fn paths_go_would_not_parse_are_refused() {
        for path in [
            "/api/v1/namespaces/%zz/pods",
            "/api/v1/pods/%4",
            "/api/v1/pods/%",
            "/healthz%",
            "/api/v1/namespaces/%FF/pods",
            "/api/v1/namespaces/%C3/pods",
        ] {
            assert!(parse(&Method::GET, path, "").is_err(), "{path}");
        }
    }

    #[test]
    fn namespaces_themselves() {
        let i = p(Method::GET, "/api/v1/namespaces/default");
        assert_eq!(
            (i.resource(), i.name(), i.namespace()),
            ("namespaces", "default", "default")
        );
        let i = p(Method::PUT, "/api/v1/namespaces/default/finalize");
        assert_eq!((i.resource(), i.subresource()), ("namespaces", "finalize"));
    }

    #[test]
    fn field_selector_names_a_single_object() {
        let i = p(Method::GET, "/apis/apiregistration.k8s.io/v1/apiservices?fieldSelector=metadata.name%3Dv1.x&watch=1");
        assert_eq!((i.verb(), i.name()), ("watch", "v1.x"));
    }

    #[test]
    fn field_selector_is_the_value_kube_reads() {
        // kube takes the first `fieldSelector` after decoding keys: naming the second one
        // would authorize a different object than the one served.
        assert_eq!(
            field_selector_name(
                "%66ieldSelector=metadata.name%3Dsecret&fieldSelector=metadata.name%3Dallowed"
            )
            .as_deref(),
            Some("secret")
        );
        assert_eq!(
            field_selector_name("fieldSelector=metadata.name%3Da%2Bb").as_deref(),
            Some("a+b")
        );
        assert_eq!(
            field_selector_name(
                "fieldSelector=metadata.name%3Dallowed;x&fieldSelector=metadata.name==other"
            )
            .as_deref(),
            Some("other")
        );
        for query in [
            "fieldSelector=metadata.name%3Da%2Cmetadata.namespace%3Dx",
            "fieldSelector=metadata.name%3Da%3Db",
            "fieldSelector=metadata.name%3Da%5C%5Cb",
            "fieldSelector=metadata.name%3D%FF",
            "fieldSelector=metadata.name!%3Da",
            "fieldSelector=metadata.name%3D..",
        ] {
            assert_eq!(field_selector_name(query), None, "{query}");
        }
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
            assert_eq!(i.verb(), "get");
        }
    }

    #[test]
    fn long_running_comes_from_verb_and_subresource_only() {
        for (method, target) in [
            ("GET", "/api/v1/namespaces/x/configmaps/c"),
            ("POST", "/api/v1/namespaces/x/configmaps"),
            ("GET", "/api/v1/namespaces/x/pods/p/status"),
            ("GET", "/fixture/anything"),
            // A method named like a long-running verb is not one.
            ("WATCH", "/fixture/anything"),
            ("PROXY", "/healthz"),
            ("WATCH", "/api/v1/namespaces/x/configmaps"),
        ] {
            let m = Method::from_bytes(method.as_bytes()).unwrap();
            assert!(!p(m, target).long_running, "{method} {target}");
        }
        for (method, target) in [
            ("GET", "/api/v1/namespaces/x/pods/p/log"),
            ("POST", "/api/v1/namespaces/x/pods/p/attach"),
            ("POST", "/api/v1/namespaces/x/pods/p/portforward"),
            ("GET", "/api/v1/namespaces/x/services/s/proxy/metrics"),
        ] {
            let m = Method::from_bytes(method.as_bytes()).unwrap();
            assert!(p(m, target).long_running, "{method} {target}");
        }
    }

    #[test]
    fn proxy_verb_keeps_the_rest_of_the_path() {
        let i = p(
            Method::GET,
            "/api/v1/proxy/namespaces/x/services/s/some/path",
        );
        assert_eq!(
            (i.verb(), i.resource(), i.name(), i.subresource()),
            ("proxy", "services", "s", "")
        );
        assert!(i.long_running);
    }

    #[test]
    fn bare_watch_prefix_is_an_error() {
        assert!(parse(&Method::GET, "/api/v1/watch", "").is_err());
    }
}
