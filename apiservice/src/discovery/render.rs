//! JSON rendering of the merged aggregated discovery document, shaped like a real server's.
//!
//! kube_core's discovery structs serialise empty lists as `[]` and have no `kind`/`apiVersion`;
//! real servers omit the `omitempty` fields and always send `singularResource`, `verbs` and a
//! three-field `responseKind`. These borrowed views write that shape directly from the merged
//! data (no cloning of resources), and the list envelope is assembled around the `items` bytes so
//! the v2 and v2beta1 bodies share one serialisation and differ only in `apiVersion`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::GroupVersionForDiscovery;
use kube_core::discovery::v2::{APIResourceDiscovery, APISubresourceDiscovery, GroupVersionKind};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;

/// Legacy `APIGroupList` as real servers write it: the groups inside carry no `kind` or
/// `apiVersion` (k8s-openapi's `APIGroup` always writes both, so it is not used here).
#[derive(Serialize)]
pub(super) struct LegacyGroupList<'a> {
    pub kind: &'static str,
    #[serde(rename = "apiVersion")]
    pub api_version: &'static str,
    pub groups: Vec<LegacyGroup<'a>>,
}

/// One entry of [`LegacyGroupList`]; `preferredVersion` is the first version.
#[derive(Serialize)]
pub(super) struct LegacyGroup<'a> {
    pub name: &'a str,
    pub versions: &'a [GroupVersionForDiscovery],
    #[serde(rename = "preferredVersion", skip_serializing_if = "Option::is_none")]
    pub preferred_version: Option<&'a GroupVersionForDiscovery>,
}

/// One version of a group, as it will be rendered.
pub(super) struct VersionOut<'a> {
    pub version: &'a str,
    pub resources: &'a [APIResourceDiscovery],
    pub freshness: Option<&'a str>,
}

/// One group, versions already in preference order.
pub(super) struct GroupOut<'a> {
    pub name: &'a str,
    pub versions: Vec<VersionOut<'a>>,
}

/// The bytes of an `APIGroupDiscoveryList` in the given `apidiscovery.k8s.io` version, built
/// around already-serialised `items`.
pub(super) fn list_bytes(api_version: &str, items: &[u8]) -> Vec<u8> {
    const HEAD: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":""#;
    const MID: &str = r#"","metadata":{},"items":"#;
    let mut out = Vec::with_capacity(HEAD.len() + api_version.len() + MID.len() + items.len() + 1);
    out.extend_from_slice(HEAD.as_bytes());
    out.extend_from_slice(api_version.as_bytes());
    out.extend_from_slice(MID.as_bytes());
    out.extend_from_slice(items);
    out.push(b'}');
    out
}

/// Serialises the `items` array.
pub(super) fn items_bytes(groups: &[GroupOut<'_>]) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(groups)
}

struct Meta<'a>(&'a str);

// === impl Meta ===

impl Serialize for Meta<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        if !self.0.is_empty() {
            m.serialize_entry("name", self.0)?;
        }
        m.end()
    }
}

// === impl GroupOut ===

impl Serialize for GroupOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("metadata", &Meta(self.name))?;
        if !self.versions.is_empty() {
            m.serialize_entry("versions", &self.versions)?;
        }
        m.end()
    }
}

// === impl VersionOut ===

impl Serialize for VersionOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("version", self.version)?;
        if !self.resources.is_empty() {
            m.serialize_entry("resources", &Seq(self.resources, Resource))?;
        }
        if let Some(f) = self.freshness.filter(|f| !f.is_empty()) {
            m.serialize_entry("freshness", f)?;
        }
        m.end()
    }
}

/// A slice rendered through a view constructor.
struct Seq<'a, T, V>(&'a [T], fn(&'a T) -> V);

// === impl Seq ===

impl<'a, T, V: Serialize> Serialize for Seq<'a, T, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&(self.1)(item))?;
        }
        seq.end()
    }
}

/// `responseKind` as Go writes `metav1.GroupVersionKind`: always all three fields. A missing
/// one is written as the empty GVK, as kube-aggregator patches it (client-go 0.26.0–0.26.3
/// panicked on nil, kubernetes/kubernetes#118361).
struct Gvk<'a>(Option<&'a GroupVersionKind>);

// === impl Gvk ===

impl Serialize for Gvk<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let field = |f: fn(&GroupVersionKind) -> &Option<String>| {
            self.0.and_then(|g| f(g).as_deref()).unwrap_or("")
        };
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("group", field(|g| &g.group))?;
        m.serialize_entry("version", field(|g| &g.version))?;
        m.serialize_entry("kind", field(|g| &g.kind))?;
        m.end()
    }
}

struct Resource<'a>(&'a APIResourceDiscovery);

// === impl Resource ===

impl Serialize for Resource<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("resource", r.resource.as_deref().unwrap_or(""))?;
        m.serialize_entry("responseKind", &Gvk(r.response_kind.as_ref()))?;
        m.serialize_entry("scope", r.scope.as_deref().unwrap_or(""))?;
        m.serialize_entry(
            "singularResource",
            r.singular_resource.as_deref().unwrap_or(""),
        )?;
        m.serialize_entry("verbs", &r.verbs)?;
        if !r.short_names.is_empty() {
            m.serialize_entry("shortNames", &r.short_names)?;
        }
        if !r.categories.is_empty() {
            m.serialize_entry("categories", &r.categories)?;
        }
        if !r.subresources.is_empty() {
            m.serialize_entry("subresources", &Seq(&r.subresources, Subresource))?;
        }
        m.end()
    }
}

struct Subresource<'a>(&'a APISubresourceDiscovery);

// === impl Subresource ===

impl Serialize for Subresource<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("subresource", r.subresource.as_deref().unwrap_or(""))?;
        m.serialize_entry("responseKind", &Gvk(r.response_kind.as_ref()))?;
        if !r.accepted_types.is_empty() {
            let accepted: Vec<Gvk<'_>> = r.accepted_types.iter().map(|g| Gvk(Some(g))).collect();
            m.serialize_entry("acceptedTypes", &accepted)?;
        }
        m.serialize_entry("verbs", &r.verbs)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_a_real_server() {
        let resources = vec![APIResourceDiscovery {
            resource: Some("apiservices".into()),
            response_kind: Some(GroupVersionKind {
                group: Some(String::new()),
                version: Some(String::new()),
                kind: Some("APIService".into()),
            }),
            scope: Some("Cluster".into()),
            singular_resource: Some("apiservice".into()),
            verbs: vec!["get".into()],
            short_names: vec![],
            categories: vec!["api-extensions".into()],
            subresources: vec![APISubresourceDiscovery {
                subresource: Some("status".into()),
                response_kind: None,
                accepted_types: vec![],
                verbs: vec!["get".into()],
            }],
        }];
        let groups = [
            GroupOut {
                name: "",
                versions: vec![VersionOut {
                    version: "v1",
                    resources: &[],
                    freshness: None,
                }],
            },
            GroupOut {
                name: "apiregistration.k8s.io",
                versions: vec![VersionOut {
                    version: "v1",
                    resources: &resources,
                    freshness: Some("Current"),
                }],
            },
        ];
        let items = items_bytes(&groups).unwrap();
        let body = String::from_utf8(list_bytes("apidiscovery.k8s.io/v2", &items)).unwrap();
        assert_eq!(
            body,
            concat!(
                r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":["#,
                r#"{"metadata":{},"versions":[{"version":"v1"}]},"#,
                r#"{"metadata":{"name":"apiregistration.k8s.io"},"versions":[{"version":"v1","resources":["#,
                r#"{"resource":"apiservices","responseKind":{"group":"","version":"","kind":"APIService"},"#,
                r#""scope":"Cluster","singularResource":"apiservice","verbs":["get"],"categories":["api-extensions"],"#,
                r#""subresources":[{"subresource":"status","responseKind":{"group":"","version":"","kind":""},"verbs":["get"]}]}"#,
                r#"],"freshness":"Current"}]}]}"#
            )
        );
    }
}
