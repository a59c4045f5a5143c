//! The APIService model: the wire types from k8s-openapi, and the validated, owned form the rest
//! of the gateway works with.
//!
//! `APIService` as it arrives (from a watch or a manifest) is all `Option`s and `i32`s; every
//! consumer would have to re-check the same invariants. [`RegisteredAPIService`] is built once,
//! through [`crate::validation::validate`], and carries only what routing, discovery and
//! the backend clients need, with defaults applied (service port 443). The condition helpers
//! follow kube-aggregator's `apiregistration/v1/helper` so the `Available` condition we write
//! behaves as kube's does (its `lastTransitionTime` moves only when the status changes).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
pub use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceCondition, APIServiceSpec, APIServiceStatus, ServiceReference,
};

use crate::traffic::TrafficPolicy;

/// Port kube-aggregator defaults `spec.service.port` to.
pub const DEFAULT_SERVICE_PORT: u16 = 443;

/// Name of the one APIService that may have an empty group: the legacy core group `v1`.
pub const LEGACY_CORE_API_SERVICE: &str = "v1.";

/// A group and version, e.g. `apps/v1`; the legacy core group has an empty group and prints
/// as plain `v1`, as `apiVersion` does.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupVersion {
    pub group: String,
    pub version: String,
}

// === impl GroupVersion ===

impl GroupVersion {
    pub fn new(group: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
        }
    }

    /// Splits an APIService name `<version>.<group>` at its first dot (kube-aggregator's
    /// `APIServiceNameToGroupVersion`). `None` when the name has no dot.
    pub fn from_api_service_name(name: &str) -> Option<Self> {
        let (version, group) = name.split_once('.')?;
        Some(Self::new(group, version))
    }

    /// The APIService name serving this group-version: `<version>.<group>` (`v1.` for core).
    pub fn api_service_name(&self) -> String {
        format!("{}.{}", self.version, self.group)
    }

    /// Whether this is the legacy core group-version (`/api/v1`).
    pub fn is_legacy_core(&self) -> bool {
        self.group.is_empty()
    }

    /// The URL path clients use for this group-version: `/apis/<g>/<v>`, or `/api/<v>` for core.
    pub fn path(&self) -> String {
        if self.is_legacy_core() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

impl fmt::Display for GroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.version)
        } else {
            write!(f, "{}/{}", self.group, self.version)
        }
    }
}

/// The Service a remote APIService points at, port defaulted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

// === impl ServiceRef ===

impl ServiceRef {
    /// The DNS name kube-aggregator uses as TLS server name (SNI and certificate check):
    /// `<name>.<namespace>.svc`, never the dialled address.
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

/// How a remote APIService is reached and trusted.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RemoteBackendSpec {
    pub service: ServiceRef,
    /// PEM bytes to verify the backend's serving certificate; `None` when absent or empty.
    pub ca_bundle: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
}

// Hand-written so logs show the bundle's size, not kilobytes of PEM bytes.

// === impl RemoteBackendSpec ===

impl fmt::Debug for RemoteBackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteBackendSpec")
            .field("service", &self.service)
            .field(
                "ca_bundle",
                &self
                    .ca_bundle
                    .as_ref()
                    .map(|b| format!("{} bytes", b.len())),
            )
            .field("insecure_skip_tls_verify", &self.insecure_skip_tls_verify)
            .finish()
    }
}

/// Where requests for an APIService go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `spec.service` is null: served by the core server behind the gateway.
    Local,
    /// `spec.service` is set: proxied to that Service.
    Remote(RemoteBackendSpec),
}

/// A validated APIService, owned and with defaults applied.
///
/// Build it with `RegisteredAPIService::try_from(&api_service)`, which runs
/// [`crate::validation::validate`]; the fields are public for reading and for tests,
/// and a value built by hand skips that validation (the route table still rejects duplicates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredAPIService {
    /// `metadata.name`, always `<version>.<group>`.
    pub name: String,
    /// `spec.group`; empty only for the legacy core APIService `v1.`.
    pub group: String,
    pub version: String,
    pub group_priority_minimum: i32,
    pub version_priority: i32,
    pub backend: Backend,
    /// What its annotations say about its traffic (see [`crate::traffic`]).
    pub traffic: TrafficPolicy,
}

// === impl RegisteredAPIService ===

impl RegisteredAPIService {
    pub fn group_version(&self) -> GroupVersion {
        GroupVersion::new(self.group.clone(), self.version.clone())
    }

    pub fn is_local(&self) -> bool {
        matches!(self.backend, Backend::Local)
    }

    /// The APIService of the legacy core group (`v1.`), which claims `/api` rather than `/apis`.
    pub fn is_legacy_core(&self) -> bool {
        self.group.is_empty()
    }

    /// The Service for a remote APIService, `None` for a local one.
    pub fn service(&self) -> Option<&ServiceRef> {
        match &self.backend {
            Backend::Local => None,
            Backend::Remote(r) => Some(&r.service),
        }
    }
}

/// The only condition type APIServices use.
pub const AVAILABLE: &str = "Available";

/// Reason and message kube-aggregator writes on local APIServices.
pub const LOCAL_REASON: &str = "Local";
pub const LOCAL_MESSAGE: &str = "Local APIServices are always available";

/// A condition's `status` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

// === impl ConditionStatus ===

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The condition of the given type, if present.
pub fn get_condition<'a>(api: &'a APIService, type_: &str) -> Option<&'a APIServiceCondition> {
    api.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The `Available` condition, if present.
pub fn available_condition(api: &APIService) -> Option<&APIServiceCondition> {
    get_condition(api, AVAILABLE)
}

/// Whether `Available` is present and exactly `True` — kube-aggregator proxies to a remote
/// APIService only then; `Unknown` and a missing condition count as unavailable.
pub fn is_available(api: &APIService) -> bool {
    available_condition(api).is_some_and(|c| c.status == ConditionStatus::True.as_str())
}

/// Sets a condition as kube-aggregator's `SetAPIServiceCondition` does: appended when no
/// condition of its type exists; otherwise reason and message are overwritten and status plus
/// `lastTransitionTime` change only when the status changes (so the time records the last
/// *transition*, not the last probe). Returns whether the object changed, so callers can skip
/// no-op status writes.
pub fn set_condition(api: &mut APIService, new: APIServiceCondition) -> bool {
    let conditions = api
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new);
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        conditions.push(new);
        return true;
    };
    let mut changed = false;
    if existing.status != new.status {
        existing.status = new.status;
        existing.last_transition_time = new.last_transition_time;
        changed = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason;
        changed = true;
    }
    if existing.message != new.message {
        existing.message = new.message;
        changed = true;
    }
    changed
}

/// Builds an `Available` condition. `now` becomes its `lastTransitionTime` if it is a transition;
/// taking the clock as an argument keeps this module free of I/O and testable.
pub fn available(
    status: ConditionStatus,
    reason: impl Into<String>,
    message: impl Into<String>,
    now: Time,
) -> APIServiceCondition {
    APIServiceCondition {
        type_: AVAILABLE.to_owned(),
        status: status.as_str().to_owned(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(now),
    }
}

/// Sets the `Available` condition (see [`set_condition`]); returns whether anything changed.
pub fn set_available_condition(
    api: &mut APIService,
    status: ConditionStatus,
    reason: impl Into<String>,
    message: impl Into<String>,
    now: Time,
) -> bool {
    set_condition(api, available(status, reason, message, now))
}

/// The condition kube-aggregator puts on every local APIService.
pub fn local_available_condition(now: Time) -> APIServiceCondition {
    available(ConditionStatus::True, LOCAL_REASON, LOCAL_MESSAGE, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;
    use k8s_openapi::ByteString;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn api(
        name: &str,
        group: &str,
        version: &str,
        service: Option<ServiceReference>,
    ) -> APIService {
        APIService {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(APIServiceSpec {
                group: Some(group.into()),
                version: Some(version.into()),
                group_priority_minimum: 100,
                version_priority: 15,
                service,
                ..Default::default()
            }),
            status: None,
        }
    }

    fn svc(port: Option<i32>) -> Option<ServiceReference> {
        Some(ServiceReference {
            namespace: Some("wardle".into()),
            name: Some("api".into()),
            port,
        })
    }

    #[test]
    fn group_version_display_and_paths() {
        let apps = GroupVersion::new("apps", "v1");
        assert_eq!(apps.to_string(), "apps/v1");
        assert_eq!(apps.path(), "/apis/apps/v1");
        assert_eq!(apps.api_service_name(), "v1.apps");
        let core = GroupVersion::new("", "v1");
        assert_eq!(core.to_string(), "v1");
        assert_eq!(core.path(), "/api/v1");
        assert_eq!(core.api_service_name(), "v1.");
        assert!(core.is_legacy_core() && !apps.is_legacy_core());
    }

    #[test]
    fn group_version_from_api_service_name() {
        assert_eq!(
            GroupVersion::from_api_service_name("v1beta1.metrics.k8s.io"),
            Some(GroupVersion::new("metrics.k8s.io", "v1beta1"))
        );
        assert_eq!(
            GroupVersion::from_api_service_name("v1."),
            Some(GroupVersion::new("", "v1"))
        );
        assert_eq!(GroupVersion::from_api_service_name("v1"), None);
    }

    #[test]
    fn service_ref_display_and_server_name() {
        let s = ServiceRef {
            namespace: "kube-system".into(),
            name: "metrics-server".into(),
            port: 443,
        };
        assert_eq!(s.to_string(), "kube-system/metrics-server:443");
        assert_eq!(s.server_name(), "metrics-server.kube-system.svc");
    }

    #[test]
    fn registered_remote_defaults_port_and_keeps_ca() {
        let mut a = api(
            "v1alpha1.wardle.example.com",
            "wardle.example.com",
            "v1alpha1",
            svc(None),
        );
        a.spec.as_mut().unwrap().ca_bundle = Some(ByteString(b"PEM".to_vec()));
        let r = RegisteredAPIService::try_from(&a).unwrap();
        assert_eq!(r.name, "v1alpha1.wardle.example.com");
        assert_eq!(
            r.group_version(),
            GroupVersion::new("wardle.example.com", "v1alpha1")
        );
        assert_eq!((r.group_priority_minimum, r.version_priority), (100, 15));
        assert!(!r.is_local() && !r.is_legacy_core());
        assert_eq!(
            r.backend,
            Backend::Remote(RemoteBackendSpec {
                service: ServiceRef {
                    namespace: "wardle".into(),
                    name: "api".into(),
                    port: 443
                },
                ca_bundle: Some(b"PEM".to_vec()),
                insecure_skip_tls_verify: false,
            })
        );
        assert_eq!(r.service().unwrap().port, 443);
    }

    #[test]
    fn registered_remote_explicit_port_insecure_and_empty_ca() {
        let mut a = api("v1.a.io", "a.io", "v1", svc(Some(8443)));
        let spec = a.spec.as_mut().unwrap();
        spec.insecure_skip_tls_verify = Some(true);
        spec.ca_bundle = Some(ByteString(Vec::new()));
        let r = RegisteredAPIService::try_from(&a).unwrap();
        let Backend::Remote(remote) = &r.backend else {
            panic!("expected remote")
        };
        assert_eq!(remote.service.port, 8443);
        assert_eq!(remote.ca_bundle, None);
        assert!(remote.insecure_skip_tls_verify);
        assert!(format!("{remote:?}").contains("insecure_skip_tls_verify: true"));
    }

    #[test]
    fn registered_local_and_legacy_core() {
        let r = RegisteredAPIService::try_from(&api("v1.", "", "v1", None)).unwrap();
        assert!(r.is_local() && r.is_legacy_core());
        assert_eq!(r.service(), None);
        assert_eq!(r.group_version().to_string(), "v1");
    }

    #[test]
    fn registered_rejects_invalid() {
        let err = RegisteredAPIService::try_from(&api("wrong", "a.io", "v1", None)).unwrap_err();
        assert!(err.has_field("metadata.name"), "{err}");
    }

    #[test]
    fn ca_bundle_debug_shows_size_only() {
        let spec = RemoteBackendSpec {
            service: ServiceRef {
                namespace: "n".into(),
                name: "s".into(),
                port: 443,
            },
            ca_bundle: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            insecure_skip_tls_verify: false,
        };
        let dbg = format!("{spec:?}");
        assert!(dbg.contains("27 bytes"), "{dbg}");
        assert!(!dbg.contains("BEGIN"), "{dbg}");
    }

    #[test]
    fn availability_helpers() {
        let mut a = api("v1.a.io", "a.io", "v1", svc(None));
        assert!(available_condition(&a).is_none());
        assert!(!is_available(&a));

        assert!(set_available_condition(
            &mut a,
            ConditionStatus::Unknown,
            "NoProbe",
            "not checked yet",
            t(10)
        ));
        assert!(!is_available(&a));

        assert!(set_available_condition(
            &mut a,
            ConditionStatus::True,
            "Passed",
            "all checks passed",
            t(20)
        ));
        assert!(is_available(&a));
        let c = available_condition(&a).unwrap();
        assert_eq!(c.last_transition_time, Some(t(20)));
        assert_eq!(c.reason.as_deref(), Some("Passed"));
        assert_eq!(
            a.status
                .as_ref()
                .unwrap()
                .conditions
                .as_ref()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut a = api("v1.a.io", "a.io", "v1", svc(None));
        set_available_condition(
            &mut a,
            ConditionStatus::False,
            "FailedDiscoveryCheck",
            "first",
            t(1),
        );

        // Same status, new reason/message: text updates, time stays.
        assert!(set_available_condition(
            &mut a,
            ConditionStatus::False,
            "ServiceNotFound",
            "second",
            t(2)
        ));
        let c = available_condition(&a).unwrap();
        assert_eq!(c.last_transition_time, Some(t(1)));
        assert_eq!(c.reason.as_deref(), Some("ServiceNotFound"));
        assert_eq!(c.message.as_deref(), Some("second"));

        // Nothing differs but the time: no change reported, time kept.
        assert!(!set_available_condition(
            &mut a,
            ConditionStatus::False,
            "ServiceNotFound",
            "second",
            t(3)
        ));
        assert_eq!(
            available_condition(&a).unwrap().last_transition_time,
            Some(t(1))
        );

        // Status flips: time moves.
        assert!(set_available_condition(
            &mut a,
            ConditionStatus::True,
            "Passed",
            "all checks passed",
            t(4)
        ));
        assert_eq!(
            available_condition(&a).unwrap().last_transition_time,
            Some(t(4))
        );
    }

    #[test]
    fn other_condition_types_are_left_alone() {
        let mut a = api("v1.a.io", "a.io", "v1", None);
        set_condition(
            &mut a,
            APIServiceCondition {
                type_: "Other".into(),
                status: "False".into(),
                ..Default::default()
            },
        );
        set_condition(&mut a, local_available_condition(t(5)));
        let conds = a.status.as_ref().unwrap().conditions.as_ref().unwrap();
        assert_eq!(conds.len(), 2);
        assert_eq!(conds[0].status, "False");
        assert!(is_available(&a));
        let c = available_condition(&a).unwrap();
        assert_eq!(c.reason.as_deref(), Some("Local"));
        assert_eq!(
            c.message.as_deref(),
            Some("Local APIServices are always available")
        );
    }
}
