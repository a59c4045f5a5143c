//! The APIService domain, with no HTTP server in it: the model and its validation, kube-aggregator's
//! priority ordering, the immutable `RouteTable`, where APIServices come from (kube watch or a
//! directory of manifests), how a Service becomes an address, availability, and the merged discovery
//! model that the gateway serves as prepared bytes.

pub mod discovery;
pub mod model;
pub mod order;
pub mod outage;
pub mod priority;
pub mod resolve;
pub mod route_table;
pub mod source;
pub mod traffic;
pub mod validation;
pub mod version;
