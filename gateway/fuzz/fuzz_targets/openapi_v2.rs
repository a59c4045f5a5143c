//! A backend's OpenAPI v2 spec filtered to its group-version, merged into the core's, and the
//! merge written as protobuf: no panic or stack overflow, the core's paths untouched, no
//! amplification (see `apiservice::fuzzing::documents::openapi_v2`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aggregation_gateway_fuzz::documents::documents::openapi_v2(data);
});
