//! The client API over gRPC: the `Kv` service. This is the one place that
//! builds `tonic::Status`; outcomes and transient errors travel as typed
//! response fields, and a status means the message itself was refused.

mod kv_service;

pub use kv_service::KvService;
