//! The `field_selector` target: `wasmctrl_selectors::fuzzing::field_selector` (its doc says what it checks)
//! under libFuzzer; the stable tests run the same check on the seeds and on generated inputs.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| wasmctrl_selectors::fuzzing::field_selector(data));
