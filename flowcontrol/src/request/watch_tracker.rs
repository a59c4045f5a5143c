//! How many watches a write will wake (k8s.io/apiserver `pkg/util/flowcontrol/watch_tracker.go`):
//! a write to an object watched by many is charged extra seats for a short while after it ends,
//! for the events it makes the server send.
//!
//! The gateway counts the watches it relays (kube counts the ones it serves), by group, resource,
//! namespace and name, as kube does; a pod watch restricted to one node (`spec.nodeName=`) is not
//! counted, as in kube, since a write reaches only the watches of its node. The counts live in a
//! fixed table of atomic counters indexed by two hashes of the key (a count-min sketch): no
//! lock, no allocation, and a collision can only overcount, which costs a write a few seats.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use gateway_request::request_info::{query_value, RequestInfo};

const SLOTS: usize = 8192;

pub struct WatchTracker {
    counts: Box<[AtomicU32]>,
}

impl Default for WatchTracker {
    fn default() -> Self {
        Self {
            counts: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

/// The two slots of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slots(usize, usize);

fn slots(group: &str, resource: &str, namespace: &str, name: &str) -> Slots {
    let mut h = DefaultHasher::new();
    (group, resource, namespace, name).hash(&mut h);
    let v = h.finish();
    Slots((v as usize) % SLOTS, ((v >> 32) as usize) % SLOTS)
}

/// A watch counted until dropped.
pub struct Registration {
    tracker: Arc<WatchTracker>,
    slots: Slots,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.tracker.add(self.slots, -1);
    }
}

impl WatchTracker {
    /// Counts the watch `info` (with its raw `query`) while the returned registration lives;
    /// `None` for what is not a watch, or is a watch kube does not count.
    pub fn register(self: &Arc<Self>, info: &RequestInfo, query: &str) -> Option<Registration> {
        if info.verb() != "watch" {
            return None;
        }
        if info.resource() == "pods" && watches_one_node(query) {
            return None;
        }
        let s = slots(
            info.api_group(),
            info.resource(),
            info.namespace(),
            info.name(),
        );
        self.add(s, 1);
        Some(Registration {
            tracker: self.clone(),
            slots: s,
        })
    }

    fn add(&self, s: Slots, delta: i32) {
        for i in [s.0, s.1] {
            if delta > 0 {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            } else {
                self.counts[i].fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn count(&self, s: Slots) -> u32 {
        self.counts[s.0]
            .load(Ordering::Relaxed)
            .min(self.counts[s.1].load(Ordering::Relaxed))
    }

    /// The watches a write described by `info` may wake: those of the whole resource, of its
    /// namespace, and of the object itself.
    pub fn interested(&self, info: &RequestInfo) -> u32 {
        if matches!(info.verb(), "get" | "list" | "watch" | "proxy") {
            return 0;
        }
        let (g, r) = (&info.api_group(), &info.resource());
        let mut n = self.count(slots(g, r, "", ""));
        if !info.namespace().is_empty() {
            n += self.count(slots(g, r, info.namespace(), ""));
        }
        if !info.name().is_empty() {
            n += self.count(slots(g, r, info.namespace(), info.name()));
        }
        n
    }
}

/// A field selector that pins `spec.nodeName` to one value (kube's built-in pod index).
fn watches_one_node(query: &str) -> bool {
    let Some(selector) = query_value(query, "fieldSelector") else {
        return false;
    };
    let Ok(selector) = std::str::from_utf8(&selector) else {
        return false;
    };
    selector.split(',').any(|term| {
        let value = term
            .strip_prefix("spec.nodeName==")
            .or_else(|| term.strip_prefix("spec.nodeName="));
        value.is_some_and(|v| !v.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use gateway_request::request_info::parse;

    fn info(method: Method, target: &str) -> (RequestInfo, String) {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        (parse(&method, path, query).unwrap(), query.to_owned())
    }

    #[test]
    fn writes_see_the_watches_that_cover_them() {
        let tracker = Arc::new(WatchTracker::default());
        let register = |target| {
            let (i, q) = info(Method::GET, target);
            tracker.register(&i, &q)
        };
        let all = register("/api/v1/configmaps?watch=1");
        let ns = register("/api/v1/namespaces/x/configmaps?watch=1");
        let other_ns = register("/api/v1/namespaces/y/configmaps?watch=1");
        let one =
            register("/api/v1/namespaces/x/configmaps?watch=1&fieldSelector=metadata.name%3Dc");
        assert!(register("/api/v1/namespaces/x/configmaps").is_none());
        // A kubelet's watch of its own pods is not counted.
        assert!(register("/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dn1").is_none());
        let pods = register("/api/v1/pods?watch=1");

        let write = |method, target| tracker.interested(&info(method, target).0);
        assert_eq!(write(Method::PUT, "/api/v1/namespaces/x/configmaps/c"), 3);
        assert_eq!(write(Method::PUT, "/api/v1/namespaces/x/configmaps/d"), 2);
        assert_eq!(write(Method::POST, "/api/v1/namespaces/z/configmaps"), 1);
        assert_eq!(write(Method::GET, "/api/v1/namespaces/x/configmaps/c"), 0);
        assert_eq!(write(Method::DELETE, "/api/v1/namespaces/x/pods/p"), 1);
        drop((all, ns, other_ns, one, pods));
        assert_eq!(write(Method::PUT, "/api/v1/namespaces/x/configmaps/c"), 0);
    }
}
