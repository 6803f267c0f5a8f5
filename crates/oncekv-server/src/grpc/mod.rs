//! The client API over gRPC: the `Kv` service, etcd's v3 API ([`etcd`]),
//! and the standard health and reflection services beside them. This is the one place that
//! builds `tonic::Status`; outcomes and transient errors travel as typed
//! response fields, and a status means the message itself was refused.

pub mod etcd;
mod health;
mod kv_service;

pub use health::{health_service, reflection_service, serving};
pub use kv_service::KvService;
