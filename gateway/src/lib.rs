//! aggregation-gateway: a front proxy that does for any Kubernetes-style API server what
//! kube-aggregator does inside kube-apiserver. This crate is the process: the TLS listener, the
//! tower stack every request crosses, the router, the backend clients (core and remote), the
//! handlers the gateway answers itself, and start-up/shutdown.

pub mod apiservice_table;
pub mod app;
pub mod auth;
pub mod backend;
pub mod body;
pub mod discovery;
pub mod error;
pub mod flowcontrol;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod identity;
pub mod leader_election;
pub mod listener;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod otel;
pub mod proxy;
pub mod request;
pub mod request_info;
pub mod router;
pub mod routing;
pub mod stack;
pub mod status;
pub mod trust;
pub mod workqueue;

/// Helpers shared by the unit tests of several modules.
#[cfg(test)]
pub(crate) mod test_util {
    use http::{HeaderMap, HeaderName, HeaderValue};

    /// A header map from name/value pairs, in order, repeated names appended.
    pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }
}
