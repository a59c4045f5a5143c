//! The ground floor of aggregation-gateway: what it knows of a request before anything decides
//! on it, in kube's terms. [`request_info`] is kube's `RequestInfo` (k8s.io/apiserver
//! `pkg/endpoints/request`): verb, API group, resource, namespace and name read from the path and
//! query; [`identity`] is kube's `user.Info` (`pkg/authentication/user`) and the headers that
//! carry it onward; [`names`] is the name validation of kube's apimachinery (`pkg/util/validation`)
//! that they and the API objects above them share. Priority and fairness, authorization, routing
//! and the access log all read these, so they live beneath all of them; this crate depends on no
//! other crate of the workspace.

pub mod identity;
pub mod names;
pub mod request_info;

/// Helpers for unit tests, here and in the crates above (feature `test-util`).
#[cfg(any(test, feature = "test-util"))]
pub mod test_util {
    use http::{HeaderMap, HeaderName, HeaderValue};

    /// A header map from name/value pairs, in order, repeated names appended.
    pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }
}
