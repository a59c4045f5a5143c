//! Merging the core server's discovery with the APIServices' into the documents the gateway serves.
//!
//! Inputs: the core's aggregated `/api` and `/apis` ([`CoreDiscovery`]; use
//! [`from_legacy`](super::from_legacy) first when the core only speaks legacy discovery) and, per
//! APIService, its [`RegisteredAPIService`] plus, for a remote one, what its backend last said
//! about that group-version ([`RemoteDiscovery`]).
//!
//! Rules (kube-aggregator's, see `handler_discovery.go` and aggregated `handler.go`):
//! * a remote APIService replaces whatever the core says about its group-version (kube's
//!   `AggregatorSource` beats `BuiltinSource`/`CRDSource`); its entry is `Current` when the last
//!   fetch succeeded and `Stale` otherwise, keeping the last resources (version only if none);
//! * a local APIService keeps the core's resources and freshness but brings its own priorities;
//!   if the core does not list that group-version (yet), it is left out: kube-aggregator's
//!   aggregated discovery takes local group-versions from the core's own, and an entry without
//!   resources would tell kubectl the group has none;
//! * the core's groups without an APIService keep the order the core publishes them in, and their
//!   versions the core's order (its preferred version first): with no APIService of its own, the
//!   gateway's `/apis` is the core's. No table of one Kubernetes release decides it;
//! * groups an APIService names (new groups, or core groups given a local APIService, as
//!   kube-apiserver registers one for each of its own) are ordered by kube-aggregator's rule:
//!   the highest groupPriorityMinimum among their versions (descending), ties by group name; versions by
//!   versionPriority (descending), ties by [`compare_versions`](crate::version::compare_versions).
//!   Against the core's groups they count as what kube-apiserver gives a group it serves without
//!   a table entry ([`CRD_PRIORITY`]): higher ones come before the core's groups, the others
//!   after ([`around_anchored`]); likewise for versions within a group;
//! * `apiregistration.k8s.io` comes first. (Legacy kube-aggregator breaks group ties by
//!   APIService name; one order for both documents is kept here, by group name as aggregated
//!   discovery does.)
//! * two APIServices for the same group-version (impossible in a real cluster, where the name is
//!   `<version>.<group>`; the route table rejects it too) resolve deterministically: remote before
//!   local, then lowest name, then higher priorities.
//!
//! Apart from the core's own order, everything is sorted by total keys, so the output bytes do
//! not depend on the order of the APIServices given. The work is O(n log n) in the number of group-versions plus one serialisation; no
//! resource is cloned.

use std::cmp::Reverse;
use std::collections::HashMap;

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroup, GroupVersionForDiscovery};
use kube_core::discovery::v2::{APIGroupDiscoveryList, APIResourceDiscovery};

use super::negotiate::Negotiated;
use super::render::{items_bytes, list_bytes, GroupOut, LegacyGroup, LegacyGroupList, VersionOut};
use super::{etag_for, DiscoveryError, FRESHNESS_CURRENT, FRESHNESS_STALE};
use crate::model::RegisteredAPIService;
use crate::order::{around_anchored, sort_groups, sort_versions};
use crate::priority::{APIREGISTRATION_GROUP, CRD_PRIORITY};

/// `apiVersion` of the aggregated discovery list, current version.
pub const APIDISCOVERY_V2: &str = "apidiscovery.k8s.io/v2";
/// `apiVersion` of the aggregated discovery list, deprecated beta (same fields).
pub const APIDISCOVERY_V2BETA1: &str = "apidiscovery.k8s.io/v2beta1";

/// What the core server behind the gateway serves, in aggregated form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CoreDiscovery {
    /// Its `/api` document (the core group, name empty). Empty when the core has none.
    pub api: APIGroupDiscoveryList,
    /// Its `/apis` document.
    pub apis: APIGroupDiscoveryList,
}

/// What a remote APIService's backend last said about the APIService's group-version.
///
/// | situation | value | rendered entry |
/// |---|---|---|
/// | never fetched (or no value passed) | [`RemoteDiscovery::never_fetched`] | version only, `Stale` |
/// | fetched, group-version listed | [`RemoteDiscovery::current`] | its resources, `Current` |
/// | backend answered without this group-version | [`RemoteDiscovery::not_listed`] | version only, `Current` |
/// | last fetch failed | [`RemoteDiscovery::failed`] with the previous resources | those, `Stale` |
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteDiscovery {
    /// The resources of the group-version, if any are known.
    pub resources: Option<Vec<APIResourceDiscovery>>,
    /// Whether the most recent fetch succeeded.
    pub fresh: bool,
}

// === impl RemoteDiscovery ===

impl RemoteDiscovery {
    /// Nothing fetched yet.
    pub fn never_fetched() -> Self {
        Self {
            resources: None,
            fresh: false,
        }
    }

    /// The last fetch succeeded and listed these resources.
    pub fn current(resources: Vec<APIResourceDiscovery>) -> Self {
        Self {
            resources: Some(resources),
            fresh: true,
        }
    }

    /// The last fetch succeeded but the backend did not list the group-version.
    pub fn not_listed() -> Self {
        Self {
            resources: None,
            fresh: true,
        }
    }

    /// The last fetch failed; keep what an earlier fetch returned, if anything.
    pub fn failed(previous: Option<Vec<APIResourceDiscovery>>) -> Self {
        Self {
            resources: previous,
            fresh: false,
        }
    }

    /// Looks `group`/`version` up in a backend's aggregated `/apis` (or `/api`) document fetched
    /// successfully: [`current`](Self::current) with its resources, or
    /// [`not_listed`](Self::not_listed).
    pub fn from_backend_document(doc: &APIGroupDiscoveryList, group: &str, version: &str) -> Self {
        doc.items
            .iter()
            .filter(|g| group_name(g) == group)
            .flat_map(|g| g.versions.iter())
            .find(|v| v.version.as_deref() == Some(version))
            .map(|v| Self::current(v.resources.clone()))
            .unwrap_or_else(Self::not_listed)
    }
}

/// One APIService as the merge sees it.
#[derive(Clone, Copy, Debug)]
pub struct APIServiceDiscovery<'a> {
    pub apiservice: &'a RegisteredAPIService,
    /// For a remote APIService, its backend's last result (`None` = never fetched). Ignored for
    /// a local APIService, whose resources come from the core.
    pub remote: Option<&'a RemoteDiscovery>,
}

// === impl APIServiceDiscovery ===

impl<'a> APIServiceDiscovery<'a> {
    pub fn new(apiservice: &'a RegisteredAPIService, remote: Option<&'a RemoteDiscovery>) -> Self {
        Self { apiservice, remote }
    }
}

/// One aggregated document, prepared in both served versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggregatedDocument {
    /// `apidiscovery.k8s.io/v2` body.
    pub v2: Bytes,
    /// `apidiscovery.k8s.io/v2beta1` body: the same bytes but for `apiVersion`.
    pub v2beta1: Bytes,
    /// Quoted ETag, `"` + uppercase hex SHA-512 of the **v2** body + `"`. Both versions are
    /// served with it, as kube-apiserver does (it hashes the v2 object once and converts to
    /// v2beta1 on the way out); `Vary: Accept` keeps caches apart.
    pub etag: String,
}

// === impl AggregatedDocument ===

impl AggregatedDocument {
    fn new(items: &[u8]) -> Self {
        let v2 = list_bytes(APIDISCOVERY_V2, items);
        let etag = etag_for(&v2);
        Self {
            v2: Bytes::from(v2),
            v2beta1: Bytes::from(list_bytes(APIDISCOVERY_V2BETA1, items)),
            etag,
        }
    }

    /// The body for a negotiated representation; `None` for [`Negotiated::Legacy`].
    pub fn body(&self, negotiated: Negotiated) -> Option<&Bytes> {
        match negotiated {
            Negotiated::AggregatedV2 => Some(&self.v2),
            Negotiated::AggregatedV2Beta1 => Some(&self.v2beta1),
            Negotiated::Legacy => None,
        }
    }
}

/// Everything the gateway's discovery handlers serve, as prepared bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedDiscovery {
    /// Aggregated `/apis`.
    pub apis: AggregatedDocument,
    /// Aggregated `/api` (legacy `/api` is answered by the core).
    pub api: AggregatedDocument,
    /// Legacy `/apis`: `APIGroupList` (`kind`, `apiVersion: v1`, `groups`), same order.
    pub apis_legacy: Bytes,
    /// Legacy `/apis/<group>` (`APIGroup`) for every group that has at least one APIService;
    /// other groups fall through to the core, like kube-aggregator's `apiGroupHandler`.
    pub groups_legacy: HashMap<String, Bytes>,
}

// === impl MergedDiscovery ===

impl MergedDiscovery {
    /// The legacy `APIGroup` body for `/apis/<group>`, if the gateway answers it.
    pub fn group_legacy(&self, group: &str) -> Option<&Bytes> {
        self.groups_legacy.get(group)
    }
}

fn group_name(g: &kube_core::discovery::v2::APIGroupDiscovery) -> &str {
    g.metadata
        .as_ref()
        .and_then(|m| m.name.as_deref())
        .unwrap_or("")
}

/// One group-version's entry while merging.
struct Slot<'a> {
    /// The priorities of the group-version's APIService; `None` for a core group-version
    /// without one, which keeps the core's place instead.
    priority: Option<(i32, i32)>,
    /// Position in the core's documents (group-versions the core does not serve come last).
    core_position: usize,
    resources: &'a [APIResourceDiscovery],
    freshness: Option<&'a str>,
}

/// A group with its versions in preference order.
struct Sorted<'a> {
    name: &'a str,
    priority: i32,
    has_apiservice: bool,
    core_position: usize,
    versions: Vec<(&'a str, Slot<'a>)>,
}

// === impl Sorted ===

impl<'a> Sorted<'a> {
    fn out(&self) -> GroupOut<'a> {
        GroupOut {
            name: self.name,
            versions: self
                .versions
                .iter()
                .map(|(version, slot)| VersionOut {
                    version,
                    resources: slot.resources,
                    freshness: slot.freshness,
                })
                .collect(),
        }
    }
}

/// The versionPriority a slot counts with: its APIService's, or [`CRD_PRIORITY`]'s.
fn version_priority(slot: &Slot<'_>) -> i32 {
    slot.priority.map_or(CRD_PRIORITY.1, |(_, vp)| vp)
}

#[derive(Default)]
struct GroupSlots<'a> {
    versions: HashMap<&'a str, Slot<'a>>,
    has_apiservice: bool,
    /// Position of the group in the core's documents (`usize::MAX`: the core does not serve it).
    core_position: usize,
}

/// Merges the core's discovery with the APIServices' (module docs give the rules) into prepared
/// bytes. Fails only if serialisation fails, which the types used cannot make happen.
pub fn merge(
    core: &CoreDiscovery,
    apiservices: &[APIServiceDiscovery<'_>],
) -> Result<MergedDiscovery, DiscoveryError> {
    let mut groups = core_slots(core);
    apiservice_slots(&mut groups, apiservices);
    let sorted = order(groups);
    render(&sorted)
}

/// 1. The core's group-versions, where the core lists them. A group (or group-version) listed
///    twice keeps its first occurrence (the documents are given, so this is deterministic).
fn core_slots(core: &CoreDiscovery) -> HashMap<&str, GroupSlots<'_>> {
    let mut groups: HashMap<&str, GroupSlots<'_>> = HashMap::new();
    for (position, item) in core
        .api
        .items
        .iter()
        .chain(core.apis.items.iter())
        .enumerate()
    {
        let group = group_name(item);
        let slots = groups.entry(group).or_insert_with(|| GroupSlots {
            core_position: position,
            ..GroupSlots::default()
        });
        for v in &item.versions {
            let Some(version) = v.version.as_deref().filter(|v| !v.is_empty()) else {
                continue;
            };
            let core_position = slots.versions.len();
            slots.versions.entry(version).or_insert_with(|| Slot {
                priority: None,
                core_position,
                resources: &v.resources,
                freshness: v.freshness.as_deref(),
            });
        }
    }

    groups
}

/// 2. APIServices, one per group-version, chosen by a total order.
fn apiservice_slots<'a>(
    groups: &mut HashMap<&'a str, GroupSlots<'a>>,
    apiservices: &'a [APIServiceDiscovery<'a>],
) {
    let mut ordered: Vec<&APIServiceDiscovery<'_>> = apiservices
        .iter()
        .filter(|a| !a.apiservice.version.is_empty())
        .collect();
    ordered.sort_by(|a, b| {
        let (x, y) = (a.apiservice, b.apiservice);
        (
            x.group.as_str(),
            x.version.as_str(),
            x.is_local(),
            x.name.as_str(),
        )
            .cmp(&(
                y.group.as_str(),
                y.version.as_str(),
                y.is_local(),
                y.name.as_str(),
            ))
            .then(Reverse(x.group_priority_minimum).cmp(&Reverse(y.group_priority_minimum)))
            .then(Reverse(x.version_priority).cmp(&Reverse(y.version_priority)))
    });
    ordered.dedup_by(|b, a| {
        a.apiservice.group == b.apiservice.group && a.apiservice.version == b.apiservice.version
    });

    for a in ordered {
        let svc = a.apiservice;
        let slots = groups
            .entry(svc.group.as_str())
            .or_insert_with(|| GroupSlots {
                core_position: usize::MAX,
                ..GroupSlots::default()
            });
        let (resources, freshness): (&[APIResourceDiscovery], Option<&str>) = if svc.is_local() {
            match slots.versions.get(svc.version.as_str()) {
                Some(core) => (core.resources, core.freshness),
                // Not served by the core (yet): kube-apiserver registers a CRD's local
                // APIService before its discovery lists the resources, and an entry without
                // them makes kubectl answer "no matches for kind" (issue 31).
                None => continue,
            }
        } else {
            let resources = a.remote.and_then(|r| r.resources.as_deref()).unwrap_or(&[]);
            let fresh = a.remote.is_some_and(|r| r.fresh);
            (
                resources,
                Some(if fresh {
                    FRESHNESS_CURRENT
                } else {
                    FRESHNESS_STALE
                }),
            )
        };
        slots.has_apiservice = true;
        let core_position = slots
            .versions
            .get(svc.version.as_str())
            .map_or(usize::MAX, |core| core.core_position);
        slots.versions.insert(
            svc.version.as_str(),
            Slot {
                priority: Some((svc.group_priority_minimum, svc.version_priority)),
                core_position,
                resources,
                freshness,
            },
        );
    }
}

/// 3. Order versions within groups, then groups: the core's keep its order, those of
///    APIServices are placed around them by priority.
fn order<'a>(groups: HashMap<&'a str, GroupSlots<'a>>) -> Vec<Sorted<'a>> {
    let (mut anchored, mut placed): (Vec<Sorted<'_>>, Vec<Sorted<'_>>) = groups
        .into_iter()
        .filter(|(_, slots)| !slots.versions.is_empty())
        .map(|(name, slots)| {
            let (mut core_versions, mut declared): (Vec<_>, Vec<_>) = slots
                .versions
                .into_iter()
                .partition(|(_, slot)| slot.priority.is_none());
            core_versions.sort_by_key(|(_, slot)| slot.core_position);
            sort_versions(&mut declared, |(v, slot)| (version_priority(slot), v));
            let versions = around_anchored(core_versions, declared, CRD_PRIORITY.1, |(_, slot)| {
                version_priority(slot)
            });
            let priority = versions
                .iter()
                .filter_map(|(_, s)| s.priority.map(|(gp, _)| gp))
                .max()
                .unwrap_or(CRD_PRIORITY.0);
            Sorted {
                name,
                priority,
                has_apiservice: slots.has_apiservice,
                core_position: slots.core_position,
                versions,
            }
        })
        .partition(|g| !g.has_apiservice);
    anchored.sort_by_key(|g| g.core_position);
    sort_groups(&mut placed, |g| (g.priority, g.name));
    let mut sorted = around_anchored(anchored, placed, CRD_PRIORITY.0, |g| g.priority);
    // The aggregator's own group leads whatever its priority (a stable sort keeps the rest).
    sorted.sort_by_key(|g| g.name != APIREGISTRATION_GROUP);

    sorted
}

/// 4. Render: the aggregated `/apis` and `/api`, then the legacy documents.
fn render(sorted: &[Sorted<'_>]) -> Result<MergedDiscovery, DiscoveryError> {
    let ser = |document: &str| {
        let document = document.to_owned();
        move |source| DiscoveryError::Serialize { document, source }
    };
    let apis_items: Vec<GroupOut<'_>> = sorted
        .iter()
        .filter(|g| !g.name.is_empty())
        .map(Sorted::out)
        .collect();
    let api_items: Vec<GroupOut<'_>> = sorted
        .iter()
        .filter(|g| g.name.is_empty())
        .map(Sorted::out)
        .collect();
    let apis = AggregatedDocument::new(&items_bytes(&apis_items).map_err(ser("/apis"))?);
    let api = AggregatedDocument::new(&items_bytes(&api_items).map_err(ser("/api"))?);

    let (apis_legacy, groups_legacy) = legacy(sorted)?;
    Ok(MergedDiscovery {
        apis,
        api,
        apis_legacy,
        groups_legacy,
    })
}

/// Legacy documents: `/apis` lists every group; `/apis/<group>` only for APIService groups.
fn legacy(sorted: &[Sorted<'_>]) -> Result<(Bytes, HashMap<String, Bytes>), DiscoveryError> {
    let ser = |document: &str| {
        let document = document.to_owned();
        move |source| DiscoveryError::Serialize { document, source }
    };
    let named: Vec<&Sorted<'_>> = sorted.iter().filter(|g| !g.name.is_empty()).collect();
    let group_versions: Vec<Vec<GroupVersionForDiscovery>> = named
        .iter()
        .map(|g| {
            g.versions
                .iter()
                .map(|(version, _)| GroupVersionForDiscovery {
                    group_version: format!("{}/{}", g.name, version),
                    version: (*version).to_owned(),
                })
                .collect()
        })
        .collect();
    let mut groups_legacy = HashMap::new();
    for (g, versions) in named.iter().zip(&group_versions) {
        if !g.has_apiservice {
            continue;
        }
        let group = APIGroup {
            name: g.name.to_owned(),
            preferred_version: versions.first().cloned(),
            server_address_by_client_cidrs: None,
            versions: versions.clone(),
        };
        let document = format!("/apis/{}", g.name);
        let bytes = serde_json::to_vec(&group).map_err(ser(&document))?;
        groups_legacy.insert(g.name.to_owned(), Bytes::from(bytes));
    }
    let list = LegacyGroupList {
        kind: "APIGroupList",
        api_version: "v1",
        groups: named
            .iter()
            .zip(&group_versions)
            .map(|(g, versions)| LegacyGroup {
                name: g.name,
                versions,
                preferred_version: versions.first(),
            })
            .collect(),
    };
    let apis_legacy = serde_json::to_vec(&list).map_err(ser("legacy /apis"))?;
    Ok((Bytes::from(apis_legacy), groups_legacy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Backend, RemoteBackendSpec, ServiceRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube_core::discovery::v2::{APIGroupDiscovery, APIVersionDiscovery, GroupVersionKind};
    use serde_json::Value;

    fn resource(plural: &str, kind: &str) -> APIResourceDiscovery {
        APIResourceDiscovery {
            resource: Some(plural.into()),
            response_kind: Some(GroupVersionKind {
                group: Some(String::new()),
                version: Some(String::new()),
                kind: Some(kind.into()),
            }),
            scope: Some("Namespaced".into()),
            singular_resource: Some(plural.trim_end_matches('s').into()),
            verbs: vec!["get".into(), "list".into()],
            ..APIResourceDiscovery::default()
        }
    }

    /// A core group: `(name, [(version, [plural])])`, every resource kind `K<plural>`.
    fn group(name: &str, versions: &[(&str, &[&str])]) -> APIGroupDiscovery {
        APIGroupDiscovery {
            metadata: Some(ObjectMeta {
                name: (!name.is_empty()).then(|| name.to_owned()),
                ..ObjectMeta::default()
            }),
            versions: versions
                .iter()
                .map(|(v, plurals)| APIVersionDiscovery {
                    version: Some((*v).into()),
                    resources: plurals
                        .iter()
                        .map(|p| resource(p, &format!("K{p}")))
                        .collect(),
                    freshness: Some("Current".into()),
                })
                .collect(),
        }
    }

    fn core(api: Vec<APIGroupDiscovery>, apis: Vec<APIGroupDiscovery>) -> CoreDiscovery {
        CoreDiscovery {
            api: APIGroupDiscoveryList {
                metadata: None,
                items: api,
            },
            apis: APIGroupDiscoveryList {
                metadata: None,
                items: apis,
            },
        }
    }

    fn svc(group: &str, version: &str, gp: i32, vp: i32, remote: bool) -> RegisteredAPIService {
        RegisteredAPIService {
            traffic: Default::default(),
            name: format!("{version}.{group}"),
            group: group.into(),
            version: version.into(),
            group_priority_minimum: gp,
            version_priority: vp,
            backend: if remote {
                Backend::Remote(RemoteBackendSpec {
                    service: ServiceRef {
                        namespace: "ns".into(),
                        name: group.replace('.', "-"),
                        port: 443,
                    },
                    ca_bundle: None,
                    insecure_skip_tls_verify: true,
                })
            } else {
                Backend::Local
            },
        }
    }

    fn json(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    /// `[(group, [version])]` of an aggregated body.
    fn layout(bytes: &[u8]) -> Vec<(String, Vec<String>)> {
        json(bytes)["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                    g["versions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v["version"].as_str().unwrap().to_owned())
                        .collect(),
                )
            })
            .collect()
    }

    fn version_entry(bytes: &[u8], group: &str, version: &str) -> Value {
        json(bytes)["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["metadata"]["name"].as_str().unwrap_or("") == group)
            .flat_map(|g| g["versions"].as_array().unwrap().clone())
            .find(|v| v["version"] == version)
            .unwrap_or_else(|| panic!("{group}/{version} missing"))
    }

    fn names(l: &[(String, Vec<String>)]) -> Vec<&str> {
        l.iter().map(|(g, _)| g.as_str()).collect()
    }

    fn kube_like_core() -> CoreDiscovery {
        core(
            vec![group("", &[("v1", &["pods", "configmaps"])])],
            vec![
                group("batch", &[("v1", &["jobs"])]),
                group("apps", &[("v1", &["deployments"])]),
                group("stable.example.com", &[("v1", &["crontabs"])]),
                group("apiregistration.k8s.io", &[("v1", &["apiservices"])]),
                group(
                    "autoscaling",
                    &[
                        ("v1", &["horizontalpodautoscalers"]),
                        ("v2", &["horizontalpodautoscalers"]),
                    ],
                ),
            ],
        )
    }

    #[test]
    fn core_only_keeps_the_cores_order() {
        let merged = merge(&kube_like_core(), &[]).unwrap();
        let l = layout(&merged.apis.v2);
        // As the core lists them, but apiregistration.k8s.io first.
        assert_eq!(
            names(&l),
            [
                "apiregistration.k8s.io",
                "batch",
                "apps",
                "stable.example.com",
                "autoscaling"
            ]
        );
        // autoscaling: the core's version order (v1 first here), not a table's.
        assert_eq!(l[4].1, ["v1", "v2"]);
        // The core group is only in /api, without a name.
        assert_eq!(
            layout(&merged.api.v2),
            [(String::new(), vec!["v1".to_owned()])]
        );
        let api = json(&merged.api.v2);
        assert_eq!(api["items"][0]["metadata"], serde_json::json!({}));
        // No APIService → no /apis/<group> bodies of ours.
        assert!(merged.groups_legacy.is_empty());
    }

    #[test]
    fn another_releases_order_is_kept_and_apiservice_groups_go_around_it() {
        // resource.k8s.io before flowcontrol, as kube-apiserver 1.33's table has it, and the
        // other way round: the gateway follows whichever the core publishes.
        for core_order in [
            ["resource.k8s.io", "flowcontrol.apiserver.k8s.io"],
            ["flowcontrol.apiserver.k8s.io", "resource.k8s.io"],
        ] {
            let c = core(
                vec![],
                core_order
                    .iter()
                    .map(|g| group(g, &[("v1beta1", &["things"]), ("v1", &["things"])]))
                    .collect(),
            );
            let high = svc("high.example.com", "v1", 1001, 10, true);
            let tie = svc("tie.example.com", "v1", 1000, 10, true);
            let merged = merge(
                &c,
                &[
                    APIServiceDiscovery::new(&tie, None),
                    APIServiceDiscovery::new(&high, None),
                ],
            )
            .unwrap();
            let l = layout(&merged.apis.v2);
            let expected = [
                "high.example.com",
                core_order[0],
                core_order[1],
                "tie.example.com",
            ];
            assert_eq!(names(&l), expected);
            // Preferred versions stay the core's (v1beta1 first here).
            assert_eq!(l[1].1, ["v1beta1", "v1"]);
            let legacy = json(&merged.apis_legacy);
            assert_eq!(
                legacy["groups"][1]["preferredVersion"]["version"],
                "v1beta1"
            );
            let legacy_names: Vec<_> = legacy["groups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["name"].as_str().unwrap())
                .collect();
            assert_eq!(legacy_names, expected);
        }
    }

    #[test]
    fn ordering_and_tie_cases() {
        // The core serves apiregistration.k8s.io, which a local APIService below names.
        let c = core(
            vec![],
            vec![group("apiregistration.k8s.io", &[("v1", &["apiservices"])])],
        );
        let services = [
            // Same group priority: ties broken by group name.
            svc("zeta.example.com", "v1", 500, 10, true),
            svc("alpha.example.com", "v1", 500, 10, true),
            // Highest groupPriorityMinimum among its versions counts for the group.
            svc("multi.example.com", "v1", 100, 10, true),
            svc("multi.example.com", "v2", 900, 10, true),
            // Same versionPriority: kube-aware version order.
            svc("versions.example.com", "v1beta1", 200, 15, true),
            svc("versions.example.com", "v1", 200, 15, true),
            svc("versions.example.com", "v10", 200, 15, true),
            svc("versions.example.com", "v2alpha1", 200, 15, true),
            svc("versions.example.com", "foo1", 200, 15, true),
            svc("versions.example.com", "v2", 200, 15, true),
            // Higher versionPriority beats the version order.
            svc("versions.example.com", "v1alpha1", 200, 20, true),
            // apiregistration is first regardless of its priority.
            svc("apiregistration.k8s.io", "v1", 1, 1, false),
        ];
        let inputs: Vec<_> = services
            .iter()
            .map(|s| APIServiceDiscovery::new(s, None))
            .collect();
        let merged = merge(&c, &inputs).unwrap();
        let l = layout(&merged.apis.v2);
        assert_eq!(
            names(&l),
            [
                "apiregistration.k8s.io",
                "multi.example.com",
                "alpha.example.com",
                "zeta.example.com",
                "versions.example.com"
            ]
        );
        assert_eq!(l[1].1, ["v2", "v1"]);
        assert_eq!(
            l[4].1,
            ["v1alpha1", "v10", "v2", "v1", "v1beta1", "v2alpha1", "foo1"]
        );
        // Legacy /apis has the same order and preferredVersion = first version.
        let legacy = json(&merged.apis_legacy);
        assert_eq!(legacy["kind"], "APIGroupList");
        assert_eq!(legacy["apiVersion"], "v1");
        let legacy_names: Vec<_> = legacy["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(legacy_names, names(&l));
        // Like real servers: the groups inside the list carry no kind/apiVersion.
        assert_eq!(
            legacy["groups"][0],
            serde_json::json!({
                "name": "apiregistration.k8s.io",
                "versions": [{"groupVersion": "apiregistration.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "apiregistration.k8s.io/v1", "version": "v1"}
            })
        );
        let versions = json(&merged.groups_legacy["versions.example.com"]);
        assert_eq!(versions["kind"], "APIGroup");
        assert_eq!(versions["apiVersion"], "v1");
        assert_eq!(
            versions["preferredVersion"],
            serde_json::json!({"groupVersion": "versions.example.com/v1alpha1", "version": "v1alpha1"})
        );
        assert_eq!(versions["versions"].as_array().unwrap().len(), 7);
        assert_eq!(
            versions["versions"][1],
            serde_json::json!({"groupVersion": "versions.example.com/v10", "version": "v10"})
        );
    }

    #[test]
    fn remote_apiservice_overrides_core() {
        let c = core(
            vec![],
            vec![
                group("apps", &[("v1", &["deployments"])]),
                group("metrics.k8s.io", &[("v1beta1", &["stale-from-core"])]),
            ],
        );
        let metrics = svc("metrics.k8s.io", "v1beta1", 100, 100, true);
        let remote = RemoteDiscovery::current(vec![resource("pods", "PodMetrics")]);
        let merged = merge(&c, &[APIServiceDiscovery::new(&metrics, Some(&remote))]).unwrap();
        let entry = version_entry(&merged.apis.v2, "metrics.k8s.io", "v1beta1");
        assert_eq!(entry["freshness"], "Current");
        assert_eq!(entry["resources"].as_array().unwrap().len(), 1);
        assert_eq!(entry["resources"][0]["resource"], "pods");
        assert_eq!(entry["resources"][0]["responseKind"]["kind"], "PodMetrics");
        assert_eq!(names(&layout(&merged.apis.v2)), ["apps", "metrics.k8s.io"]);
        assert!(merged.group_legacy("metrics.k8s.io").is_some());
        assert!(merged.group_legacy("apps").is_none());
    }

    #[test]
    fn local_apiservice_takes_core_resources_and_its_own_priorities() {
        let c = core(
            vec![],
            vec![
                group("apps", &[("v1", &["deployments"])]),
                group(
                    "stable.example.com",
                    &[("v1", &["crontabs"]), ("v2", &["crontabs"])],
                ),
            ],
        );
        // Without APIServices: the core's order, groups and versions.
        let l = layout(&merge(&c, &[]).unwrap().apis.v2);
        assert_eq!(names(&l), ["apps", "stable.example.com"]);
        assert_eq!(l[1].1, ["v1", "v2"]);

        let v1 = svc("stable.example.com", "v1", 19000, 200, false);
        let missing = svc("stable.example.com", "v3", 19000, 1, false);
        let merged = merge(
            &c,
            &[
                APIServiceDiscovery::new(&v1, None),
                APIServiceDiscovery::new(&missing, None),
            ],
        )
        .unwrap();
        let l = layout(&merged.apis.v2);
        assert_eq!(names(&l), ["stable.example.com", "apps"]);
        // v3 is not listed by the core (yet): left out, rather than an entry without resources
        // that kubectl would believe (issue 31).
        assert_eq!(l[0].1, ["v1", "v2"]);
        let v1 = version_entry(&merged.apis.v2, "stable.example.com", "v1");
        assert_eq!(v1["resources"][0]["resource"], "crontabs");
        assert_eq!(v1["freshness"], "Current");
        let legacy = json(merged.group_legacy("stable.example.com").unwrap());
        assert!(!legacy["versions"].to_string().contains("v3"), "{legacy}");
        // A group the core does not list at all is not listed either.
        let absent = svc("later.example.com", "v1", 19000, 1, false);
        let merged_absent = merge(&c, &[APIServiceDiscovery::new(&absent, None)]).unwrap();
        assert!(merged_absent.group_legacy("later.example.com").is_none());
        assert_eq!(
            names(&layout(&merged_absent.apis.v2)),
            ["apps", "stable.example.com"]
        );
        let group = json(merged.group_legacy("stable.example.com").unwrap());
        assert_eq!(group["preferredVersion"]["version"], "v1");
    }

    #[test]
    fn stale_and_empty_entries() {
        let c = core(vec![], vec![]);
        let never = svc("never.example.com", "v1", 100, 100, true);
        let failed = svc("failed.example.com", "v1", 100, 100, true);
        let failed_empty = svc("failedempty.example.com", "v1", 100, 100, true);
        let unlisted = svc("unlisted.example.com", "v1", 100, 100, true);
        let ok = svc("ok.example.com", "v1", 100, 100, true);
        let failed_r = RemoteDiscovery::failed(Some(vec![resource("widgets", "Widget")]));
        let failed_empty_r = RemoteDiscovery::failed(None);
        let unlisted_r = RemoteDiscovery::not_listed();
        let ok_r = RemoteDiscovery::current(vec![resource("gadgets", "Gadget")]);
        let never_r = RemoteDiscovery::never_fetched();
        let merged = merge(
            &c,
            &[
                APIServiceDiscovery::new(&never, None),
                APIServiceDiscovery::new(&failed, Some(&failed_r)),
                APIServiceDiscovery::new(&failed_empty, Some(&failed_empty_r)),
                APIServiceDiscovery::new(&unlisted, Some(&unlisted_r)),
                APIServiceDiscovery::new(&ok, Some(&ok_r)),
            ],
        )
        .unwrap();
        let body = &merged.apis.v2;
        assert_eq!(
            version_entry(body, "never.example.com", "v1"),
            serde_json::json!({"version": "v1", "freshness": "Stale"})
        );
        let f = version_entry(body, "failed.example.com", "v1");
        assert_eq!(f["freshness"], "Stale");
        assert_eq!(f["resources"][0]["resource"], "widgets");
        assert_eq!(
            version_entry(body, "failedempty.example.com", "v1"),
            serde_json::json!({"version": "v1", "freshness": "Stale"})
        );
        assert_eq!(
            version_entry(body, "unlisted.example.com", "v1"),
            serde_json::json!({"version": "v1", "freshness": "Current"})
        );
        assert_eq!(
            version_entry(body, "ok.example.com", "v1")["freshness"],
            "Current"
        );
        // never_fetched() behaves like passing nothing.
        let merged2 = merge(&c, &[APIServiceDiscovery::new(&never, Some(&never_r))]).unwrap();
        assert_eq!(
            version_entry(&merged2.apis.v2, "never.example.com", "v1"),
            serde_json::json!({"version": "v1", "freshness": "Stale"})
        );
    }

    #[test]
    fn remote_discovery_from_backend_document() {
        let doc = APIGroupDiscoveryList {
            metadata: None,
            items: vec![group("metrics.k8s.io", &[("v1beta1", &["pods", "nodes"])])],
        };
        let found = RemoteDiscovery::from_backend_document(&doc, "metrics.k8s.io", "v1beta1");
        assert!(found.fresh);
        assert_eq!(found.resources.as_ref().unwrap().len(), 2);
        let missing = RemoteDiscovery::from_backend_document(&doc, "metrics.k8s.io", "v1");
        assert_eq!(missing, RemoteDiscovery::not_listed());
    }

    #[test]
    fn v2_and_v2beta1_differ_only_in_api_version() {
        let s = svc("metrics.k8s.io", "v1beta1", 100, 100, true);
        let r = RemoteDiscovery::current(vec![resource("pods", "PodMetrics")]);
        let merged = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, Some(&r))]).unwrap();
        for doc in [&merged.apis, &merged.api] {
            let v2 = std::str::from_utf8(&doc.v2).unwrap();
            let v2beta1 = std::str::from_utf8(&doc.v2beta1).unwrap();
            assert_ne!(v2, v2beta1);
            assert_eq!(
                v2.replacen(
                    "apidiscovery.k8s.io/v2\"",
                    "apidiscovery.k8s.io/v2beta1\"",
                    1
                ),
                v2beta1
            );
            let (a, b) = (json(&doc.v2), json(&doc.v2beta1));
            assert_eq!(a["kind"], "APIGroupDiscoveryList");
            assert_eq!(a["apiVersion"], "apidiscovery.k8s.io/v2");
            assert_eq!(b["apiVersion"], "apidiscovery.k8s.io/v2beta1");
            assert_eq!(a["metadata"], serde_json::json!({}));
            assert_eq!(a["items"], b["items"]);
            assert_eq!(doc.body(Negotiated::AggregatedV2), Some(&doc.v2));
            assert_eq!(doc.body(Negotiated::AggregatedV2Beta1), Some(&doc.v2beta1));
            assert_eq!(doc.body(Negotiated::Legacy), None);
        }
    }

    #[test]
    fn etag_is_sha512_of_the_v2_body() {
        let merged = merge(&kube_like_core(), &[]).unwrap();
        for doc in [&merged.apis, &merged.api] {
            let etag = &doc.etag;
            assert_eq!(etag.len(), 130);
            assert!(etag.starts_with('"') && etag.ends_with('"'));
            assert!(etag[1..129]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)));
            assert_eq!(*etag, etag_for(&doc.v2));
        }
        assert_ne!(merged.apis.etag, merged.api.etag);
        // A change in content changes the ETag.
        let s = svc("x.example.com", "v1", 1, 1, true);
        let other = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, None)]).unwrap();
        assert_ne!(other.apis.etag, merged.apis.etag);
        assert_eq!(other.api.etag, merged.api.etag);
    }

    #[test]
    fn every_resource_keeps_a_response_kind() {
        let mut bare = resource("things", "Thing");
        bare.response_kind = None;
        let s = svc("x.example.com", "v1", 1, 1, true);
        let r = RemoteDiscovery::current(vec![bare]);
        let merged = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, Some(&r))]).unwrap();
        for body in [&merged.apis.v2, &merged.api.v2] {
            for g in json(body)["items"].as_array().unwrap() {
                for v in g["versions"].as_array().unwrap() {
                    for r in v["resources"].as_array().into_iter().flatten() {
                        assert!(r["responseKind"].is_object(), "{r}");
                    }
                }
            }
        }
        let e = version_entry(&merged.apis.v2, "x.example.com", "v1");
        assert_eq!(
            e["resources"][0]["responseKind"],
            serde_json::json!({"group": "", "version": "", "kind": ""})
        );
    }

    #[test]
    fn core_group_apiservice() {
        // A remote `v1.` APIService takes over the core group in /api, and stays out of /apis.
        let s = svc("", "v1", 18000, 1, true);
        let r = RemoteDiscovery::current(vec![resource("widgets", "Widget")]);
        let merged = merge(&kube_like_core(), &[APIServiceDiscovery::new(&s, Some(&r))]).unwrap();
        let e = version_entry(&merged.api.v2, "", "v1");
        assert_eq!(e["resources"].as_array().unwrap().len(), 1);
        assert!(!names(&layout(&merged.apis.v2)).contains(&""));
        assert!(merged.groups_legacy.is_empty());
        let legacy = json(&merged.apis_legacy);
        assert!(legacy["groups"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["name"] != ""));
    }

    #[test]
    fn empty_inputs() {
        let merged = merge(&CoreDiscovery::default(), &[]).unwrap();
        assert_eq!(
            &merged.apis.v2[..],
            br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[]}"#
        );
        assert_eq!(
            json(&merged.apis_legacy),
            serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        );
    }

    /// A small deterministic shuffle (xorshift + Fisher–Yates), so the test needs no extra crate.
    fn shuffle<T>(items: &mut [T], seed: &mut u64) {
        for i in (1..items.len()).rev() {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            let j = (*seed % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }

    #[test]
    fn merge_is_order_independent() {
        let mut services = vec![
            svc("apiregistration.k8s.io", "v1", 18000, 15, false),
            svc("apps", "v1", 17800, 15, false),
            svc("metrics.k8s.io", "v1beta1", 100, 100, true),
            svc("metrics.k8s.io", "v1", 100, 100, true),
            svc("a.example.com", "v1", 100, 100, true),
            svc("b.example.com", "v1", 100, 100, true),
            svc("b.example.com", "v2", 100, 100, true),
            svc("c.example.com", "v1alpha1", 500, 5, true),
            svc("stable.example.com", "v1", 1000, 100, false),
            svc("stable.example.com", "v9", 1000, 100, false),
        ];
        // Duplicates of one group-version: the winner must not depend on input order.
        let mut dup_local = svc("a.example.com", "v1", 9000, 9000, false);
        dup_local.name = "v1.a.example.com".into();
        services.push(dup_local);
        let mut dup_other_name = svc("a.example.com", "v1", 1, 1, true);
        dup_other_name.name = "zzz".into();
        services.push(dup_other_name);

        let remotes: Vec<RemoteDiscovery> = services
            .iter()
            .enumerate()
            .map(|(i, s)| match i % 3 {
                0 => RemoteDiscovery::current(vec![resource(&format!("r{i}s"), &s.version)]),
                1 => RemoteDiscovery::failed(Some(vec![resource("olds", "Old")])),
                _ => RemoteDiscovery::not_listed(),
            })
            .collect();
        let mut inputs: Vec<APIServiceDiscovery<'_>> = services
            .iter()
            .zip(&remotes)
            .map(|(s, r)| APIServiceDiscovery::new(s, Some(r)))
            .collect();
        // The core's order is an input that counts; only the APIServices' order must not.
        let c = kube_like_core();
        let reference = merge(&c, &inputs).unwrap();

        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..50 {
            shuffle(&mut inputs, &mut seed);
            let merged = merge(&c, &inputs).unwrap();
            assert_eq!(merged, reference);
        }
        // Sanity: the remote duplicate with the lower name (input 4, a failed fetch) won.
        let e = version_entry(&reference.apis.v2, "a.example.com", "v1");
        assert_eq!(e["freshness"], "Stale");
        assert_eq!(e["resources"][0]["resource"], "olds");
    }

    #[test]
    fn real_server_document_round_trips_through_the_merge() {
        // Shaped like a real kube-apiserver's aggregated /apis (keys sorted, creationTimestamp
        // null, empty group/version in responseKind, a cross-group subresource).
        let real = r#"{
          "apiVersion": "apidiscovery.k8s.io/v2",
          "items": [
            {"metadata": {"creationTimestamp": null, "name": "apiregistration.k8s.io"},
             "versions": [{"freshness": "Current", "resources": [
               {"categories": ["api-extensions"], "resource": "apiservices",
                "responseKind": {"group": "", "kind": "APIService", "version": ""},
                "scope": "Cluster", "singularResource": "apiservice",
                "subresources": [{"responseKind": {"group": "", "kind": "APIService", "version": ""},
                                  "subresource": "status", "verbs": ["get", "patch", "update"]}],
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}],
               "version": "v1"}]},
            {"metadata": {"creationTimestamp": null, "name": "apps"},
             "versions": [{"freshness": "Current", "resources": [
               {"categories": ["all"], "resource": "deployments",
                "responseKind": {"group": "", "kind": "Deployment", "version": ""},
                "scope": "Namespaced", "shortNames": ["deploy"], "singularResource": "deployment",
                "subresources": [
                  {"responseKind": {"group": "autoscaling", "kind": "Scale", "version": "v1"},
                   "subresource": "scale", "verbs": ["get", "patch", "update"]},
                  {"responseKind": {"group": "", "kind": "Deployment", "version": ""},
                   "subresource": "status", "verbs": ["get", "patch", "update"]}],
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}],
               "version": "v1"}]},
            {"metadata": {"creationTimestamp": null, "name": "autoscaling"},
             "versions": [
               {"freshness": "Current", "resources": [
                 {"categories": ["all"], "resource": "horizontalpodautoscalers",
                  "responseKind": {"group": "", "kind": "HorizontalPodAutoscaler", "version": ""},
                  "scope": "Namespaced", "shortNames": ["hpa"], "singularResource": "horizontalpodautoscaler",
                  "verbs": ["get", "list"]}], "version": "v2"},
               {"freshness": "Current", "resources": [
                 {"resource": "horizontalpodautoscalers",
                  "responseKind": {"group": "", "kind": "HorizontalPodAutoscaler", "version": ""},
                  "scope": "Namespaced", "singularResource": "horizontalpodautoscaler",
                  "verbs": ["get", "list"]}], "version": "v1"}]}
          ],
          "kind": "APIGroupDiscoveryList",
          "metadata": {}
        }"#;
        let apis: APIGroupDiscoveryList = serde_json::from_str(real).unwrap();
        let c = CoreDiscovery {
            api: APIGroupDiscoveryList::default(),
            apis,
        };
        let merged = merge(&c, &[]).unwrap();
        let out = json(&merged.apis.v2);
        let input: Value = serde_json::from_str(real).unwrap();
        // Same groups, versions and resources (metadata differs only by the null timestamp).
        assert_eq!(
            layout(&merged.apis.v2),
            [
                ("apiregistration.k8s.io".to_owned(), vec!["v1".to_owned()]),
                ("apps".to_owned(), vec!["v1".to_owned()]),
                (
                    "autoscaling".to_owned(),
                    vec!["v2".to_owned(), "v1".to_owned()]
                ),
            ]
        );
        for i in 0..3 {
            assert_eq!(out["items"][i]["versions"], input["items"][i]["versions"]);
        }
        assert_eq!(
            out["items"][1]["metadata"],
            serde_json::json!({"name": "apps"})
        );
        // And what we serve parses back into the client types.
        let back: APIGroupDiscoveryList = serde_json::from_slice(&merged.apis.v2beta1).unwrap();
        assert_eq!(
            back.items,
            c.apis
                .items
                .iter()
                .cloned()
                .map(|mut g| {
                    g.metadata = Some(ObjectMeta {
                        name: g.metadata.unwrap().name,
                        ..ObjectMeta::default()
                    });
                    g
                })
                .collect::<Vec<_>>()
        );
    }
}
