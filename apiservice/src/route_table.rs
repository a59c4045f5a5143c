//! The routing snapshot: which APIService, if any, claims a request path.
//!
//! Controllers build a [`RouteTable`] whenever APIServices or their availability change and
//! publish it whole (arc-swap); the request path only reads it. So the table is immutable, and a
//! lookup is a couple of hash probes on borrowed path segments: no allocation, no lock, and cost
//! independent of how many APIServices exist.
//!
//! Claims follow kube-aggregator's mux (`AddAPIService`):
//! - `/apis/<g>/<v>` and everything under `/apis/<g>/<v>/` → that APIService;
//! - `/apis/<g>` and `/apis/<g>/` → group discovery, only while some APIService has group `<g>`;
//! - `/api` and everything under `/api/` → the legacy core APIService `v1.`, only when it is
//!   remote (a local `v1.` leaves `/api` to the core server);
//! - anything else → nothing; the gateway falls through to the core server.
//!
//! `/apis` itself is not claimed here: the merged group list is the discovery handler's.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIServiceCondition;

use crate::model::{
    available, available_condition, APIService, ConditionStatus, RegisteredAPIService,
    LEGACY_CORE_API_SERVICE,
};
use crate::resolve::ResolveReason;

/// Whether an APIService may receive traffic, from its `Available` condition.
///
/// kube-aggregator proxies to a remote APIService only when `Available` is exactly `True`;
/// `Unknown` (or no condition yet) is not good enough. Local APIServices are always served by the
/// core server whatever this says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Availability {
    Available,
    Unavailable {
        reason: UnavailableReason,
        message: String,
    },
    #[default]
    Unknown,
}

/// Why an APIService is not available, as the `Available` condition's `reason` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnavailableReason {
    /// The Service or its endpoints (kube-aggregator's resolve reasons).
    Resolve(ResolveReason),
    /// The discovery probe failed, or the backend's transport could not be built.
    FailedDiscoveryCheck,
    /// A reason read from a stored condition that is none of the above.
    Recorded(String),
}

// === impl UnavailableReason ===

impl UnavailableReason {
    /// The reason of a stored condition, typed where the gateway knows it.
    pub fn recorded(reason: &str) -> Self {
        const RESOLVE: [ResolveReason; 6] = [
            ResolveReason::ServiceNotFound,
            ResolveReason::ServiceAccessError,
            ResolveReason::ServicePortError,
            ResolveReason::EndpointsAccessError,
            ResolveReason::EndpointsNotFound,
            ResolveReason::MissingEndpoints,
        ];
        if reason == FAILED_DISCOVERY_CHECK {
            return Self::FailedDiscoveryCheck;
        }
        match RESOLVE.into_iter().find(|r| r.as_str() == reason) {
            Some(r) => Self::Resolve(r),
            None => Self::Recorded(reason.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Resolve(r) => r.as_str(),
            Self::FailedDiscoveryCheck => FAILED_DISCOVERY_CHECK,
            Self::Recorded(r) => r,
        }
    }

    /// kube-aggregator says `Unknown` when it could not look (the Service or its endpoints could
    /// not be read) and `False` when it looked and found something wrong.
    pub fn condition_status(&self) -> ConditionStatus {
        match self {
            Self::Resolve(r) => r.condition_status(),
            Self::FailedDiscoveryCheck | Self::Recorded(_) => ConditionStatus::False,
        }
    }
}

impl fmt::Display for UnavailableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const FAILED_DISCOVERY_CHECK: &str = "FailedDiscoveryCheck";

// === impl Availability ===

impl Availability {
    /// Reads the `Available` condition: `True` → Available, `False` → Unavailable with its
    /// reason and message, anything else or absent → Unknown.
    pub fn of(api: &APIService) -> Self {
        match available_condition(api) {
            Some(c) if c.status == ConditionStatus::True.as_str() => Self::Available,
            Some(c) if c.status == ConditionStatus::False.as_str() => Self::Unavailable {
                reason: UnavailableReason::recorded(c.reason.as_deref().unwrap_or_default()),
                message: c.message.clone().unwrap_or_default(),
            },
            _ => Self::Unknown,
        }
    }

    pub fn unavailable(reason: UnavailableReason, message: impl Into<String>) -> Self {
        Self::Unavailable {
            reason,
            message: message.into(),
        }
    }

    pub fn is_available(&self) -> bool {
        matches!(self, Self::Available)
    }

    /// The `Available` condition kube-aggregator writes for this result (`local`: the APIService
    /// is served by the core server).
    pub fn condition(&self, local: bool, now: Time) -> APIServiceCondition {
        match self {
            Self::Available if local => available(
                ConditionStatus::True,
                "Local",
                "Local APIServices are always available",
                now,
            ),
            Self::Available => available(ConditionStatus::True, "Passed", "all checks passed", now),
            Self::Unavailable { reason, message } => available(
                reason.condition_status(),
                reason.as_str(),
                message.as_str(),
                now,
            ),
            Self::Unknown => available(ConditionStatus::Unknown, "Unknown", "", now),
        }
    }
}

/// As `kubectl get apiservices` prints the AVAILABLE column: `True`, `False (<Reason>)`, `Unknown`.
impl fmt::Display for Availability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Available => f.write_str("True"),
            Self::Unavailable { reason, .. } if !reason.as_str().is_empty() => {
                write!(f, "False ({reason})")
            }
            Self::Unavailable { .. } => f.write_str("False"),
            Self::Unknown => f.write_str("Unknown"),
        }
    }
}

/// One APIService with the backend handle the gateway built for it.
#[derive(Clone, Debug)]
pub struct Route<B> {
    pub api_service: Arc<RegisteredAPIService>,
    /// Opaque to this crate: whatever the gateway needs to send the request (a client for a
    /// remote Service, or a marker for the core server).
    pub backend: B,
    pub available: Availability,
}

/// What a request path resolves to.
#[derive(Debug)]
pub enum Lookup<'a, B> {
    /// `/apis/<g>/<v>` or below: the APIService for that group-version.
    GroupVersion(&'a Route<B>),
    /// `/apis/<g>` or `/apis/<g>/`: group discovery; the group has at least one APIService.
    Group(&'a str),
    /// `/api` or below while `v1.` is a remote APIService.
    LegacyCore(&'a Route<B>),
    /// Not claimed by any APIService: the core server's.
    None,
}

// Manual impls: a derive would require `B: Clone`, but only references are copied.

// === impl Lookup ===

impl<B> Clone for Lookup<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Lookup<'_, B> {}

/// The versions of one group: version → index into `RouteTable::routes`.
#[derive(Clone, Debug, Default)]
struct GroupRoutes {
    versions: HashMap<Box<str>, usize>,
}

/// Immutable map from request paths to APIService routes. See the module docs for the rules.
///
/// Lookups are O(1) in the number of APIServices (two hash probes, hashing only the path's group
/// and version segments) and never allocate: the maps are keyed by `Box<str>` and probed with
/// `&str` slices of the path.
#[derive(Clone, Debug)]
pub struct RouteTable<B> {
    /// Sorted by APIService name, so iteration order does not depend on insertion order.
    routes: Vec<Route<B>>,
    by_name: HashMap<Box<str>, usize>,
    /// Non-empty groups only; the legacy core group is reached through `/api`.
    groups: HashMap<Box<str>, GroupRoutes>,
    /// Index of `v1.` when it is remote.
    legacy_core: Option<usize>,
}

// === impl RouteTable ===

impl<B> Default for RouteTable<B> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<B> RouteTable<B> {
    /// A table that claims nothing: every request goes to the core server.
    pub fn empty() -> Self {
        Self {
            routes: Vec::new(),
            by_name: HashMap::new(),
            groups: HashMap::new(),
            legacy_core: None,
        }
    }

    pub fn builder() -> RouteTableBuilder<B> {
        RouteTableBuilder::new()
    }

    /// Builds a table from `(APIService, backend)` pairs with unknown availability; see
    /// [`RouteTableBuilder::build`] for duplicates.
    pub fn from_routes(
        routes: impl IntoIterator<Item = (RegisteredAPIService, B)>,
    ) -> (Self, Vec<DuplicateRoute<B>>) {
        let mut b = RouteTableBuilder::new();
        for (api, backend) in routes {
            b.insert(api, backend, Availability::Unknown);
        }
        b.build()
    }

    /// Resolves a request path (without query string; percent-encoding is not decoded, which is
    /// fine because group and version names cannot contain encoded characters).
    pub fn lookup<'a>(&'a self, path: &str) -> Lookup<'a, B> {
        if let Some(rest) = path.strip_prefix("/apis") {
            // "/apis" alone is the group list; "/apisx" is not ours at all.
            let Some(rest) = rest.strip_prefix('/') else {
                return Lookup::None;
            };
            let (group, after_group) = split_segment(rest);
            if group.is_empty() {
                return Lookup::None; // "/apis/", "/apis//v1"
            }
            let Some((group_key, group_routes)) = self.groups.get_key_value(group) else {
                return Lookup::None;
            };
            let Some(after_group) = after_group else {
                return Lookup::Group(group_key); // "/apis/<g>"
            };
            if after_group.is_empty() {
                return Lookup::Group(group_key); // "/apis/<g>/"
            }
            let (version, _) = split_segment(after_group);
            if version.is_empty() {
                return Lookup::None; // "/apis/<g>//..."
            }
            match group_routes.versions.get(version) {
                Some(&i) => Lookup::GroupVersion(&self.routes[i]),
                None => Lookup::None,
            }
        } else if path == "/api" || path.starts_with("/api/") {
            match self.legacy_core {
                Some(i) => Lookup::LegacyCore(&self.routes[i]),
                None => Lookup::None,
            }
        } else {
            Lookup::None
        }
    }

    /// All routes, ordered by APIService name.
    pub fn routes(&self) -> impl Iterator<Item = &Route<B>> {
        self.routes.iter()
    }

    /// The routes of one group (unordered; use [`crate::order`] for discovery order). Empty for
    /// an unknown group and for the legacy core group.
    pub fn group_routes<'a>(&'a self, group: &str) -> impl Iterator<Item = &'a Route<B>> + 'a {
        self.groups
            .get(group)
            .into_iter()
            .flat_map(|g| g.versions.values())
            .map(|&i| &self.routes[i])
    }

    /// The route by APIService name (`<version>.<group>`).
    pub fn get(&self, name: &str) -> Option<&Route<B>> {
        self.by_name.get(name).map(|&i| &self.routes[i])
    }

    /// The remote legacy core route (`v1.`), if `/api` is proxied.
    pub fn legacy_core(&self) -> Option<&Route<B>> {
        self.legacy_core.map(|i| &self.routes[i])
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The same table with availability recomputed per route, for an availability controller
    /// that publishes a new snapshot without touching the APIServices or backends.
    pub fn with_availability(&self, mut f: impl FnMut(&Route<B>) -> Availability) -> Self
    where
        B: Clone,
    {
        let mut next = self.clone();
        for route in &mut next.routes {
            route.available = f(route);
        }
        next
    }
}

/// Splits off the first path segment: `"g/v/x"` → `("g", Some("v/x"))`, `"g"` → `("g", None)`.
fn split_segment(s: &str) -> (&str, Option<&str>) {
    match s.split_once('/') {
        Some((head, tail)) => (head, Some(tail)),
        None => (s, None),
    }
}

/// An APIService the builder refused because an earlier one already claimed its name or its
/// group-version; returned to the caller, which knows where it came from and can report it.
#[derive(Clone, Debug)]
pub struct DuplicateRoute<B> {
    pub api_service: Arc<RegisteredAPIService>,
    pub backend: B,
    /// Name of the APIService that was kept.
    pub kept: String,
}

// === impl DuplicateRoute ===

impl<B> fmt::Display for DuplicateRoute<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gv = self.api_service.group_version();
        if self.api_service.name == self.kept {
            write!(
                f,
                "APIService {:?} is defined more than once; keeping the first definition",
                self.kept
            )
        } else {
            write!(
                f,
                "APIService {:?} claims {gv}, already served by APIService {:?}; ignoring it",
                self.api_service.name, self.kept
            )
        }
    }
}

/// Collects routes for a [`RouteTable`]. The first APIService inserted for a name or a
/// group-version wins; feed it in a stable order (e.g. by file path) for reproducible results.
#[derive(Debug)]
pub struct RouteTableBuilder<B> {
    routes: Vec<Route<B>>,
    by_name: HashMap<Box<str>, usize>,
    /// `(group, version)` → index, to catch hand-built APIServices whose name and group-version
    /// disagree. Validated ones cannot collide here without colliding by name.
    by_group_version: HashMap<(Box<str>, Box<str>), usize>,
    duplicates: Vec<DuplicateRoute<B>>,
}

// === impl RouteTableBuilder ===

impl<B> Default for RouteTableBuilder<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> RouteTableBuilder<B> {
    pub fn new() -> Self {
        Self {
            routes: Vec::new(),
            by_name: HashMap::new(),
            by_group_version: HashMap::new(),
            duplicates: Vec::new(),
        }
    }

    /// Adds a route; a duplicate is set aside and returned by [`build`](Self::build).
    pub fn insert(
        &mut self,
        api_service: impl Into<Arc<RegisteredAPIService>>,
        backend: B,
        available: Availability,
    ) -> &mut Self {
        let api_service = api_service.into();
        let kept = self
            .by_name
            .get(api_service.name.as_str())
            .copied()
            .or_else(|| {
                self.by_group_version
                    .get(&(
                        Box::from(api_service.group.as_str()),
                        Box::from(api_service.version.as_str()),
                    ))
                    .copied()
            });
        if let Some(i) = kept {
            self.duplicates.push(DuplicateRoute {
                kept: self.routes[i].api_service.name.clone(),
                api_service,
                backend,
            });
            return self;
        }
        let i = self.routes.len();
        self.by_name.insert(api_service.name.as_str().into(), i);
        self.by_group_version.insert(
            (
                api_service.group.as_str().into(),
                api_service.version.as_str().into(),
            ),
            i,
        );
        self.routes.push(Route {
            api_service,
            backend,
            available,
        });
        self
    }

    /// Freezes the table and hands back the rejected duplicates, in insertion order.
    pub fn build(self) -> (RouteTable<B>, Vec<DuplicateRoute<B>>) {
        let mut routes = self.routes;
        routes.sort_by(|a, b| a.api_service.name.cmp(&b.api_service.name));

        let mut by_name = HashMap::with_capacity(routes.len());
        let mut groups: HashMap<Box<str>, GroupRoutes> = HashMap::new();
        let mut legacy_core = None;
        for (i, route) in routes.iter().enumerate() {
            let api = &route.api_service;
            by_name.insert(Box::from(api.name.as_str()), i);
            if api.group.is_empty() {
                if api.name == LEGACY_CORE_API_SERVICE && !api.is_local() {
                    legacy_core = Some(i);
                }
                continue;
            }
            groups
                .entry(Box::from(api.group.as_str()))
                .or_default()
                .versions
                .insert(Box::from(api.version.as_str()), i);
        }
        let table = RouteTable {
            routes,
            by_name,
            groups,
            legacy_core,
        };
        (table, self.duplicates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        set_available_condition, APIServiceSpec, Backend, RemoteBackendSpec, ServiceRef,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;

    fn remote(group: &str, version: &str) -> RegisteredAPIService {
        RegisteredAPIService {
            traffic: Default::default(),
            name: format!("{version}.{group}"),
            group: group.into(),
            version: version.into(),
            group_priority_minimum: 100,
            version_priority: 100,
            backend: Backend::Remote(RemoteBackendSpec {
                service: ServiceRef {
                    namespace: "ns".into(),
                    name: format!("svc-{group}"),
                    port: 443,
                },
                ca_bundle: None,
                insecure_skip_tls_verify: true,
            }),
        }
    }

    fn local(group: &str, version: &str) -> RegisteredAPIService {
        RegisteredAPIService {
            traffic: Default::default(),
            backend: Backend::Local,
            ..remote(group, version)
        }
    }

    fn table(services: Vec<RegisteredAPIService>) -> RouteTable<&'static str> {
        let (t, dups) = RouteTable::from_routes(services.into_iter().map(|s| (s, "backend")));
        assert!(dups.is_empty());
        t
    }

    fn gv_name<B>(l: Lookup<'_, B>) -> Option<String> {
        match l {
            Lookup::GroupVersion(r) => Some(r.api_service.name.clone()),
            _ => None,
        }
    }

    fn sample() -> RouteTable<&'static str> {
        table(vec![
            remote("metrics.k8s.io", "v1beta1"),
            remote("wardle.example.com", "v1alpha1"),
            remote("wardle.example.com", "v1beta1"),
            local("apps", "v1"),
        ])
    }

    #[test]
    fn group_version_paths() {
        let t = sample();
        for (path, want) in [
            ("/apis/metrics.k8s.io/v1beta1", "v1beta1.metrics.k8s.io"),
            ("/apis/metrics.k8s.io/v1beta1/", "v1beta1.metrics.k8s.io"),
            (
                "/apis/metrics.k8s.io/v1beta1/nodes",
                "v1beta1.metrics.k8s.io",
            ),
            (
                "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/x",
                "v1beta1.metrics.k8s.io",
            ),
            (
                "/apis/wardle.example.com/v1alpha1/flunders",
                "v1alpha1.wardle.example.com",
            ),
            (
                "/apis/wardle.example.com/v1beta1",
                "v1beta1.wardle.example.com",
            ),
            // Local APIServices are routes too; the router sends them to the core server.
            ("/apis/apps/v1/deployments", "v1.apps"),
        ] {
            assert_eq!(gv_name(t.lookup(path)).as_deref(), Some(want), "{path}");
        }
    }

    #[test]
    fn group_paths() {
        let t = sample();
        for path in ["/apis/wardle.example.com", "/apis/wardle.example.com/"] {
            assert!(
                matches!(t.lookup(path), Lookup::Group("wardle.example.com")),
                "{path}"
            );
        }
        assert!(matches!(t.lookup("/apis/apps"), Lookup::Group("apps")));
    }

    #[test]
    fn unclaimed_paths_fall_through() {
        let t = sample();
        for path in [
            "",
            "/",
            "/apis",
            "/apis/",
            "/apisx",
            "/apisx/metrics.k8s.io/v1beta1",
            "/apis//v1",
            "/apis//",
            "/apis/metrics.k8s.io//v1beta1",
            "/apis/metrics.k8s.io//",
            "/apis/metrics.k8s.io/v1",       // group known, version not
            "/apis/metrics.k8s.io/v1beta1x", // no prefix match on a segment
            "/apis/metrics.k8s.io.evil/v1beta1",
            "/apis/METRICS.k8s.io/v1beta1",
            "/apis/batch/v1/jobs", // core group without an APIService
            "/apis/batch",
            "/api",
            "/api/v1/pods",
            "/healthz",
            "/openapi/v3",
            "apis/metrics.k8s.io/v1beta1", // not absolute
        ] {
            assert!(matches!(t.lookup(path), Lookup::None), "{path:?}");
        }
    }

    #[test]
    fn legacy_core_only_when_remote() {
        let t = table(vec![local("", "v1"), remote("a.io", "v1")]);
        assert!(matches!(t.lookup("/api"), Lookup::None));
        assert!(matches!(t.lookup("/api/v1/pods"), Lookup::None));
        assert!(t.legacy_core().is_none());
        assert!(t.get("v1.").is_some());

        let t = table(vec![remote("", "v1")]);
        for path in ["/api", "/api/", "/api/v1", "/api/v1/namespaces/x/pods"] {
            match t.lookup(path) {
                Lookup::LegacyCore(r) => assert_eq!(r.api_service.name, "v1.", "{path}"),
                _ => panic!("{path} should be LegacyCore"),
            }
        }
        for path in ["/apix", "/apis", "/apis//v1", "/apis/v1"] {
            assert!(matches!(t.lookup(path), Lookup::None), "{path}");
        }
        assert_eq!(t.legacy_core().unwrap().api_service.name, "v1.");
    }

    #[test]
    fn duplicates_are_rejected_and_returned() {
        let mut b = RouteTable::builder();
        b.insert(remote("a.io", "v1"), 1, Availability::Available)
            .insert(remote("a.io", "v1"), 2, Availability::Unknown)
            .insert(remote("b.io", "v1"), 3, Availability::Unknown);
        // Hand-built with a name that disagrees with its group-version.
        let mut odd = remote("b.io", "v1");
        odd.name = "other".into();
        b.insert(odd, 4, Availability::Unknown);
        let (t, dups) = b.build();

        assert_eq!(t.len(), 2);
        let kept = t.get("v1.a.io").unwrap();
        assert_eq!(
            (kept.backend, &kept.available),
            (1, &Availability::Available)
        );
        assert_eq!(dups.len(), 2);
        assert_eq!((dups[0].backend, dups[0].kept.as_str()), (2, "v1.a.io"));
        assert_eq!(
            dups[0].to_string(),
            "APIService \"v1.a.io\" is defined more than once; keeping the first definition"
        );
        assert_eq!((dups[1].backend, dups[1].kept.as_str()), (4, "v1.b.io"));
        assert_eq!(
            dups[1].to_string(),
            "APIService \"other\" claims b.io/v1, already served by APIService \"v1.b.io\"; ignoring it"
        );
        assert!(t.get("other").is_none());
    }

    #[test]
    fn routes_are_ordered_by_name_whatever_the_input_order() {
        let t = table(vec![
            remote("c.io", "v1"),
            remote("a.io", "v2"),
            remote("a.io", "v1"),
        ]);
        let names: Vec<&str> = t.routes().map(|r| r.api_service.name.as_str()).collect();
        assert_eq!(names, ["v1.a.io", "v1.c.io", "v2.a.io"]);
        let mut in_group: Vec<&str> = t
            .group_routes("a.io")
            .map(|r| r.api_service.version.as_str())
            .collect();
        in_group.sort_unstable();
        assert_eq!(in_group, ["v1", "v2"]);
        assert_eq!(t.group_routes("nope").count(), 0);
        assert_eq!(t.group_routes("").count(), 0);
    }

    #[test]
    fn empty_table() {
        let t: RouteTable<()> = RouteTable::empty();
        assert!(t.is_empty());
        assert_eq!(t.len(), 0);
        assert!(t.get("v1.a.io").is_none());
        for path in ["/api", "/apis", "/apis/a.io", "/apis/a.io/v1"] {
            assert!(matches!(t.lookup(path), Lookup::None));
        }
        assert!(RouteTable::<()>::default().is_empty());
    }

    #[test]
    fn availability_from_conditions_and_display() {
        let mut api = APIService {
            metadata: ObjectMeta::default(),
            spec: Some(APIServiceSpec::default()),
            status: None,
        };
        assert_eq!(Availability::of(&api), Availability::Unknown);
        let now = Time(Timestamp::UNIX_EPOCH);
        set_available_condition(
            &mut api,
            ConditionStatus::False,
            "FailedDiscoveryCheck",
            "boom",
            now.clone(),
        );
        let a = Availability::of(&api);
        assert_eq!(
            a,
            Availability::Unavailable {
                reason: UnavailableReason::FailedDiscoveryCheck,
                message: "boom".into()
            }
        );
        assert!(!a.is_available());
        assert_eq!(a.to_string(), "False (FailedDiscoveryCheck)");
        set_available_condition(
            &mut api,
            ConditionStatus::True,
            "Passed",
            "all checks passed",
            now.clone(),
        );
        assert!(Availability::of(&api).is_available());
        assert_eq!(Availability::Available.to_string(), "True");
        set_available_condition(&mut api, ConditionStatus::Unknown, "", "", now);
        assert_eq!(Availability::of(&api), Availability::Unknown);
        assert_eq!(Availability::Unknown.to_string(), "Unknown");
        let bare = Availability::unavailable(UnavailableReason::Recorded(String::new()), "");
        assert_eq!(bare.to_string(), "False");
    }

    #[test]
    fn conditions_use_kube_aggregators_statuses() {
        let now = || Time(Timestamp::UNIX_EPOCH);
        let c = Availability::Available.condition(true, now());
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some("Local"))
        );
        let c = Availability::Available.condition(false, now());
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("True", Some("Passed"))
        );
        // Could not look: Unknown. Looked and found it wrong: False.
        for (reason, status) in [
            ("ServiceAccessError", "Unknown"),
            ("EndpointsAccessError", "Unknown"),
            ("ServiceNotFound", "False"),
            ("FailedDiscoveryCheck", "False"),
            ("SomethingElse", "False"),
        ] {
            let a = Availability::unavailable(UnavailableReason::recorded(reason), "m");
            let c = a.condition(false, now());
            assert_eq!(
                (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
                (status, Some(reason), Some("m")),
                "{reason}"
            );
        }
    }

    #[test]
    fn with_availability_changes_only_availability() {
        let t = sample();
        let next = t.with_availability(|r| {
            if r.api_service.group == "metrics.k8s.io" {
                Availability::Available
            } else {
                Availability::Unknown
            }
        });
        assert_eq!(next.len(), t.len());
        match next.lookup("/apis/metrics.k8s.io/v1beta1/nodes") {
            Lookup::GroupVersion(r) => assert!(r.available.is_available()),
            _ => panic!("route lost"),
        }
        // The original snapshot is untouched.
        assert_eq!(
            t.get("v1beta1.metrics.k8s.io").unwrap().available,
            Availability::Unknown
        );
    }

    #[test]
    fn lookup_in_a_table_of_ten_thousand() {
        let mut services = Vec::with_capacity(10_000);
        for g in 0..2_500 {
            for v in ["v1", "v1beta1", "v2alpha1", "v3"] {
                services.push(remote(&format!("g{g}.example.com"), v));
            }
        }
        let t = table(services);
        assert_eq!(t.len(), 10_000);
        for g in (0..2_500).step_by(7) {
            let group = format!("g{g}.example.com");
            for v in ["v1", "v1beta1", "v2alpha1", "v3"] {
                let path = format!("/apis/{group}/{v}/things/x");
                assert_eq!(
                    gv_name(t.lookup(&path)),
                    Some(format!("{v}.{group}")),
                    "{path}"
                );
            }
            assert!(
                matches!(t.lookup(&format!("/apis/{group}")), Lookup::Group(found) if found == group)
            );
            assert!(matches!(
                t.lookup(&format!("/apis/{group}/v9")),
                Lookup::None
            ));
        }
        assert!(matches!(
            t.lookup("/apis/g2500.example.com/v1"),
            Lookup::None
        ));
        assert_eq!(
            t.get("v3.g2499.example.com").unwrap().api_service.version,
            "v3"
        );
    }
}
