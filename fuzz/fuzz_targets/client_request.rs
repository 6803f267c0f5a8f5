#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oncekv_fuzz::client_request(data));
