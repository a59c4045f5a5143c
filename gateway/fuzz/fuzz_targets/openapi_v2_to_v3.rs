//! A backend's OpenAPI v2 spec converted to the v3 document of its group-version: no panic or
//! stack overflow, and no more copying than allowed (see
//! `apiservice::fuzzing::documents::openapi_v2_to_v3`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aggregation_gateway_fuzz::documents::documents::openapi_v2_to_v3(data);
});
