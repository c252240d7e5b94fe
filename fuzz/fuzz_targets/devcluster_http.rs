//! The `devcluster_http` target: `wasmctrl_devcluster::fuzzing::http_requests` (its doc says
//! what it checks and the input format) under libFuzzer; the stable tests run the same check
//! on the seeds and on generated inputs.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| wasmctrl_devcluster::fuzzing::http_requests(data));
