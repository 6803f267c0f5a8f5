#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oncekv_fuzz::batch_request(data));
