//! `request_info::parse` on arbitrary method, path and query: never panics, and the attributes
//! it returns are consistent (see `aggregation_gateway_fuzz::fuzzing::request_info`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aggregation_gateway_fuzz::fuzzing::request_info(data);
});
