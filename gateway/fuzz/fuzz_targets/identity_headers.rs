//! The identity header sanitiser on arbitrary header maps: after `set_identity_headers` no
//! client-sent `x-remote-*`, `impersonate-*` or `authorization` header survives (see
//! `aggregation_gateway_fuzz::fuzzing::identity_headers`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aggregation_gateway_fuzz::fuzzing::identity_headers(data);
});
