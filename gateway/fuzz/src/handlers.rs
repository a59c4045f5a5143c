//! The gateway's `handlers` module, as much of it as is fuzzed.

#[path = "../../src/handlers/apiservice_printing.rs"]
pub mod apiservice_printing;
