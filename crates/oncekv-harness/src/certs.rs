//! Certificates for a TLS cluster: the product's own implementation
//! (`oncekv_server::certs`, behind `oncekv certs`), where the harness's
//! TLS clusters and the tests find it.

pub use oncekv_server::certs::*;
