//! aggregation-gateway: a front proxy that does for any Kubernetes-style API server what
//! kube-aggregator does inside kube-apiserver. This crate is the process.
//!
//! The folders are the layers, top to bottom; a layer imports only from the layers below it
//! (`python3 /work/shared/tools/import-cycles` finds no cycle, and no file imports upwards):
//!
//! 1. [`app`]: start-up in named steps (configuration, clients, controllers, stack, listener) and
//!    shutdown.
//! 2. [`front`]: the listener (TLS, HTTP/1.1 and HTTP/2, connection limits) and the tower stack
//!    every request crosses (access log, audit, trace, authentication, limits, timeout,
//!    authorization).
//! 3. [`handlers`]: the router (kube-aggregator's `handler_proxy.go`) and the answers the gateway
//!    gives itself: discovery and OpenAPI documents, health, metrics, APIService table printing.
//! 4. [`control`]: the loops that publish what the request path reads: routes and availability,
//!    merged discovery and OpenAPI, the trust ConfigMap, leader election, core readiness.
//! 5. [`backend`]: the clients requests are proxied with: the core server and remote APIServices
//!    (pools, retries, balancing, probes), and the proxying written once ([`backend::proxy`]).
//! 6. The bottom, plain files and [`auth`]: the types and decisions every layer shares: bodies,
//!    request extensions, authentication, errors and Statuses, metrics, tracing export, logging,
//!    memory, the work queue, health checks.
//!
//! Beneath this crate, as crates of their own so that Cargo holds their layering: API Priority
//! and Fairness (`gateway-flowcontrol`; its configuration's watch stays in
//! [`control::flowcontrol`]), and the ground floor both stand on (`gateway-request`: kube's
//! request attributes ([`request_info`]), the caller's identity ([`identity`]) and
//! apimachinery's name rules), re-exported here under their old names.

// 1. Wiring.
pub mod app;

// 2. The front: listener and tower stack.
pub mod front;

// 3. The request path's own answers, and the router.
pub mod handlers;

// 4. The control side.
pub mod control;

// 5. The backends.
pub mod backend;

// 6. The bottom.
pub mod auth;
pub mod body;
pub mod conditional;
pub mod error;
pub mod extensions;
#[doc(hidden)]
pub mod fuzzing;
pub mod health_check;
pub mod host;
pub use gateway_request::identity;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod otel;
pub use gateway_request::request_info;
pub mod status;
pub mod test_hook;
pub mod workqueue;

/// Helpers shared by the unit tests of several modules.
#[cfg(test)]
pub(crate) mod test_util {
    pub use gateway_request::test_util::headers;

    /// A TLS server config with a fresh self-signed certificate for `name`, offering `alpn`,
    /// and the roots that trust it.
    pub fn self_signed_server(
        name: &str,
        alpn: &[&[u8]],
    ) -> (rustls::ServerConfig, rustls::RootCertStore) {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        (tls, roots)
    }
}
