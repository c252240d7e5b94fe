//! The `object_meta` target: `wasmctrl::fuzzing::object_meta` (its doc says what it checks) under
//! libFuzzer; the stable tests run the same check on the seeds and on generated inputs.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| wasmctrl::fuzzing::object_meta(data));
