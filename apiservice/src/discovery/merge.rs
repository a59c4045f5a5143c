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
                // them makes kubectl answer "no matches for kind".
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
mod tests;
