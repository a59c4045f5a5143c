//! The APIService Table rewriter on arbitrary core answers (lists and watch events): never a
//! panic, and what is rewritten is kube-aggregator's four columns, no larger than the answer
//! allows (see `aggregation_gateway_fuzz::fuzzing::apiservice_table`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aggregation_gateway_fuzz::fuzzing::apiservice_table(data);
});
