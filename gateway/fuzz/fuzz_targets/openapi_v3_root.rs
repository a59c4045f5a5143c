//! Backends' OpenAPI v3 roots unioned: each key owned by the last root listing it, the body
//! listing exactly the owned keys (see `apiservice::fuzzing::documents::openapi_v3_root`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aggregation_gateway_fuzz::documents::documents::openapi_v3_root(data);
});
