//! apiservice's OpenAPI document code, as `apiservice::discovery` has it.

#[path = "../../../apiservice/src/discovery/document.rs"]
mod document;
pub use document::{etag_for, DiscoveryError, MAX_JSON_DEPTH};

#[path = "../../../apiservice/src/discovery/openapi.rs"]
pub mod openapi;
#[path = "../../../apiservice/src/discovery/openapi_v2.rs"]
pub mod openapi_v2;
#[path = "../../../apiservice/src/discovery/openapi_v2_proto/mod.rs"]
pub mod openapi_v2_proto;
#[path = "../../../apiservice/src/discovery/openapi_v2_to_v3.rs"]
pub mod openapi_v2_to_v3;
