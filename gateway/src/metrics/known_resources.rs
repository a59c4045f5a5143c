//! The group, version, resource and subresource names the request metrics may carry.
//!
//! Those four labels come from the request path, which the client writes: taken as they are, a
//! client sending `/apis/x1/v1/y1`, `/apis/x2/v1/y2`, ... would grow the metrics registry (and
//! every scrape) without end, before authentication has decided anything. kube-apiserver does not
//! have that problem because only routes it installed are instrumented. The gateway proxies
//! paths it has no route table for, so it asks the merged discovery instead: a label value is
//! used only when discovery lists it, anything else is recorded as `other`.
//!
//! The index is rebuilt by the discovery controller whenever the merged documents change (off
//! the request path) and read with one `ArcSwap` load per request. Names are kept as `Arc<str>`
//! so labelling a request clones reference counts, not strings.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use kube::core::discovery::v2::APIGroupDiscoveryList;

/// The label value for a name discovery does not list.
pub const OTHER: &str = "other";

static OTHER_LABEL: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(OTHER));
static EMPTY_LABEL: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));

/// The group, version, resource and subresource labels of one resource request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceLabels {
    pub group: Arc<str>,
    pub version: Arc<str>,
    pub resource: Arc<str>,
    pub subresource: Arc<str>,
}

impl ResourceLabels {
    /// All four empty: what kube records for a non-resource request.
    pub fn empty() -> Self {
        Self {
            group: EMPTY_LABEL.clone(),
            version: EMPTY_LABEL.clone(),
            resource: EMPTY_LABEL.clone(),
            subresource: EMPTY_LABEL.clone(),
        }
    }

    /// A resource request for something discovery does not list.
    fn unknown(subresource: &str) -> Self {
        Self {
            group: OTHER_LABEL.clone(),
            version: OTHER_LABEL.clone(),
            resource: OTHER_LABEL.clone(),
            subresource: optional_other(subresource),
        }
    }
}

/// `""` stays `""` (no subresource), anything else becomes `other`.
fn optional_other(name: &str) -> Arc<str> {
    if name.is_empty() {
        EMPTY_LABEL.clone()
    } else {
        OTHER_LABEL.clone()
    }
}

/// Group → version → resource → subresources, as the merged discovery lists them.
#[derive(Debug, Default)]
pub struct KnownResources {
    groups: HashMap<String, KnownGroup>,
}

#[derive(Debug)]
struct KnownGroup {
    name: Arc<str>,
    versions: HashMap<String, KnownVersion>,
}

#[derive(Debug)]
struct KnownVersion {
    name: Arc<str>,
    resources: HashMap<String, KnownResource>,
}

#[derive(Debug)]
struct KnownResource {
    name: Arc<str>,
    subresources: HashMap<String, Arc<str>>,
}

// === impl KnownResources ===

impl KnownResources {
    /// The index of aggregated discovery documents (`apidiscovery.k8s.io/v2` bodies, as the
    /// merged `/api` and `/apis` are kept). A document that does not parse adds nothing: the
    /// worst outcome is `other` where a name could have been.
    pub fn from_aggregated<'a>(documents: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut known = Self::default();
        for document in documents {
            let Ok(list) = serde_json::from_slice::<APIGroupDiscoveryList>(document) else {
                continue;
            };
            for group in list.items {
                let name = group.metadata.and_then(|m| m.name).unwrap_or_default();
                let entry = known
                    .groups
                    .entry(name.clone())
                    .or_insert_with(|| KnownGroup {
                        name: Arc::from(name),
                        versions: HashMap::new(),
                    });
                for version in group.versions {
                    let Some(version_name) = version.version else {
                        continue;
                    };
                    let version_entry =
                        entry
                            .versions
                            .entry(version_name.clone())
                            .or_insert_with(|| KnownVersion {
                                name: Arc::from(version_name),
                                resources: HashMap::new(),
                            });
                    for resource in version.resources {
                        let Some(resource_name) = resource.resource else {
                            continue;
                        };
                        let resource_entry = version_entry
                            .resources
                            .entry(resource_name.clone())
                            .or_insert_with(|| KnownResource {
                                name: Arc::from(resource_name),
                                subresources: HashMap::new(),
                            });
                        for sub in resource.subresources {
                            if let Some(sub) = sub.subresource {
                                resource_entry
                                    .subresources
                                    .entry(sub.clone())
                                    .or_insert_with(|| Arc::from(sub));
                            }
                        }
                    }
                }
            }
        }
        known
    }

    /// The labels of a resource request: each name as discovery spells it, or `other` from the
    /// first one discovery does not list onwards (a known resource of an unknown group would
    /// still say nothing useful). The core group is `""`.
    pub fn labels(
        &self,
        group: &str,
        version: &str,
        resource: &str,
        subresource: &str,
    ) -> ResourceLabels {
        let Some(g) = self.groups.get(group) else {
            return ResourceLabels::unknown(subresource);
        };
        let Some(v) = g.versions.get(version) else {
            return ResourceLabels {
                group: g.name.clone(),
                ..ResourceLabels::unknown(subresource)
            };
        };
        let Some(r) = v.resources.get(resource) else {
            return ResourceLabels {
                group: g.name.clone(),
                version: v.name.clone(),
                ..ResourceLabels::unknown(subresource)
            };
        };
        let subresource = if subresource.is_empty() {
            EMPTY_LABEL.clone()
        } else {
            r.subresources
                .get(subresource)
                .cloned()
                .unwrap_or_else(|| OTHER_LABEL.clone())
        };
        ResourceLabels {
            group: g.name.clone(),
            version: v.name.clone(),
            resource: r.name.clone(),
            subresource,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> Vec<u8> {
        serde_json::json!({
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": [{
                "metadata": {"name": "wardle.example.com"},
                "versions": [{
                    "version": "v1alpha1",
                    "resources": [{
                        "resource": "flunders",
                        "responseKind": {"group": "", "version": "", "kind": "Flunder"},
                        "scope": "Namespaced",
                        "singularResource": "flunder",
                        "verbs": ["get", "list"],
                        "subresources": [{
                            "subresource": "status",
                            "responseKind": {"group": "", "version": "", "kind": "Flunder"},
                            "verbs": ["get"]
                        }]
                    }]
                }]
            }]
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn listed_names_are_labels_and_the_rest_is_other() {
        let doc = document();
        let known = KnownResources::from_aggregated([doc.as_slice()]);
        let l = known.labels("wardle.example.com", "v1alpha1", "flunders", "status");
        assert_eq!(
            (&*l.group, &*l.version, &*l.resource, &*l.subresource),
            ("wardle.example.com", "v1alpha1", "flunders", "status")
        );
        let l = known.labels("wardle.example.com", "v1alpha1", "flunders", "");
        assert_eq!(&*l.subresource, "");
        let l = known.labels("wardle.example.com", "v1alpha1", "flunders", "x-made-up");
        assert_eq!(&*l.subresource, OTHER);
        let l = known.labels("wardle.example.com", "v1alpha1", "made-up", "");
        assert_eq!(
            (&*l.group, &*l.version, &*l.resource),
            ("wardle.example.com", "v1alpha1", OTHER)
        );
        let l = known.labels("made-up.example.com", "v1", "things", "status");
        assert_eq!(
            (&*l.group, &*l.version, &*l.resource, &*l.subresource),
            (OTHER, OTHER, OTHER, OTHER)
        );
    }

    #[test]
    fn a_document_that_does_not_parse_adds_nothing() {
        let known = KnownResources::from_aggregated([b"not json".as_slice()]);
        assert_eq!(&*known.labels("", "v1", "pods", "").group, OTHER);
    }
}
