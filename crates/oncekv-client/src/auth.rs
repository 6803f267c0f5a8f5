//! [`Credentials`]: who the client says it is once the cluster enforces
//! authentication. With a user and password it logs in (`Authenticate`)
//! before its first call and again when the token expires; the token goes
//! with every call as `authorization: Bearer <token>` ([`AuthInterceptor`]).
//! A client certificate (mutual TLS) needs no credentials here: the
//! connector presents it.

use oncekv_proto::{AUTHORIZATION_METADATA, BEARER};
use std::sync::{Arc, Mutex};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;

/// How the client authenticates.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Log in as `user` with `password`, and again when the token expires.
    Password {
        /// The user's name.
        user: String,
        /// Its password.
        password: String,
    },
    /// Send this token (from an earlier login) as it is.
    Token(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Password { user, .. } => write!(f, "Password({user:?}, ..)"),
            Credentials::Token(_) => f.write_str("Token(..)"),
        }
    }
}

impl Credentials {
    /// `USER:PASSWORD`, as the CLI's `--user` takes it (the password may
    /// contain ':').
    pub fn parse_user(text: &str) -> Result<Credentials, String> {
        match text.split_once(':') {
            Some((user, password)) if !user.is_empty() => Ok(Credentials::Password {
                user: user.to_string(),
                password: password.to_string(),
            }),
            _ => Err("expected USER:PASSWORD".to_string()),
        }
    }
}

/// The token calls carry, shared by a client's connections.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenSlot(Arc<Mutex<Option<String>>>);

impl TokenSlot {
    pub(crate) fn get(&self) -> Option<String> {
        crate::client::lock(&self.0).clone()
    }

    pub(crate) fn set(&self, token: Option<String>) {
        *crate::client::lock(&self.0) = token;
    }
}

/// Adds the current token to each call's metadata.
#[derive(Clone, Debug)]
pub struct AuthInterceptor {
    token: TokenSlot,
}

impl AuthInterceptor {
    pub(crate) fn new(token: TokenSlot) -> AuthInterceptor {
        AuthInterceptor { token }
    }
}

impl Interceptor for AuthInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.token.get() {
            let value = MetadataValue::try_from(format!("{BEARER}{token}"))
                .map_err(|_| tonic::Status::invalid_argument("the token is not valid metadata"))?;
            request.metadata_mut().insert(AUTHORIZATION_METADATA, value);
        }
        Ok(request)
    }
}
