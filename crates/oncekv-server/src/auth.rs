//! Who is calling: password hashing (argon2id, on a blocking thread, never
//! on the apply path, bounded by [`crate::login_guard`]), login tokens and
//! the check of a call's credentials against the replicated users. The
//! node's own checks and logins built on these (`Node::authenticate`,
//! `Node::login`, limited by [`crate::login_guard`]) are in
//! [`crate::node`], a layer above.
//!
//! A token is `v1.<user>.<revision>.<expires_ms>.<mac>`: the MAC is
//! HMAC-SHA256 under the cluster's token key (drawn by the leader into the
//! entry that enabled authentication, so every node checks every token),
//! over the user, the revision of the user's password (a new password or a
//! re-created user voids older tokens) and the cluster time after which it
//! is refused. Tokens are checked against the node's applied cluster time.

use crate::login_guard::LoginRefused;
use crate::raft::consensus::WriteError;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use hmac::{Hmac, Mac};
use oncekv_proto::{AUTHORIZATION_METADATA, BEARER};
use oncekv_state::{AuthTable, ClusterTime, LogIndex, Principal, TokenKey};
use sha2::Sha256;
use std::sync::OnceLock;

/// What a call presented.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// A token from `Authenticate`.
    pub token: Option<String>,
    /// The Common Name of a verified client certificate.
    pub certificate_user: Option<String>,
    /// The serial number of a verified client certificate.
    pub certificate_serial: Option<Vec<u8>>,
}

impl Credentials {
    /// The credentials of a gRPC request: its bearer token and its client
    /// certificate's name.
    pub fn of<T>(request: &tonic::Request<T>) -> Credentials {
        let token = request
            .metadata()
            .get(AUTHORIZATION_METADATA)
            .and_then(|value| value.to_str().ok())
            .map(|value| {
                value
                    .strip_prefix(BEARER)
                    .unwrap_or(value)
                    .trim()
                    .to_string()
            });
        Credentials {
            token,
            certificate_user: crate::tls::client_certificate_name(request),
            certificate_serial: crate::tls::client_certificate_serial(request),
        }
    }
}

/// Why a call has no principal while authentication is enforced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token and no client certificate.
    #[error(
        "authentication is enabled: log in (--user NAME[:PASSWORD]) or present a client certificate"
    )]
    Missing,
    /// A token that does not parse or whose MAC is wrong.
    #[error("the token is not valid: log in again")]
    BadToken,
    /// A token past its expiry.
    #[error("the token expired at cluster time {0} ms: log in again")]
    Expired(u64),
    /// A token of a user whose password changed, or who was deleted.
    #[error("the token's user {0:?} changed or no longer exists: log in again")]
    Revoked(String),
    /// A client certificate naming no user.
    #[error("the client certificate names {0:?}, who is not a user")]
    UnknownCertificateUser(String),
    /// A client certificate on the cluster's revocation list.
    #[error("the client certificate with serial number {0} is revoked: use another certificate")]
    CertificateRevoked(String),
    /// Wrong user or password (not saying which).
    #[error("wrong user name or password")]
    WrongPassword,
}

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &TokenKey, user: &str, revision: LogIndex, expires: ClusterTime) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(&key.0).expect("HMAC takes a key of any length");
    mac.update(format!("v1|{user}|{}|{}", revision.0, expires.0).as_bytes());
    mac
}

/// A token for `user` (at its password `revision`) valid until `expires`.
pub fn issue_token(key: &TokenKey, user: &str, revision: LogIndex, expires: ClusterTime) -> String {
    let mac = hex::encode(mac(key, user, revision, expires).finalize().into_bytes());
    format!("v1.{user}.{}.{}.{mac}", revision.0, expires.0)
}

/// The user a token names, if its MAC, expiry (against `now`) and the
/// user's current revision check out.
pub fn check_token(
    auth: &AuthTable,
    token: &str,
    now: ClusterTime,
) -> Result<Principal, AuthError> {
    let key = auth.token_key().ok_or(AuthError::BadToken)?;
    // A user name may contain '.', so the fields are split from the end.
    let rest = token.strip_prefix("v1.").ok_or(AuthError::BadToken)?;
    let mut tail = rest.rsplitn(4, '.');
    let (Some(given), Some(expires), Some(revision), Some(user)) =
        (tail.next(), tail.next(), tail.next(), tail.next())
    else {
        return Err(AuthError::BadToken);
    };
    let revision = LogIndex(revision.parse().map_err(|_| AuthError::BadToken)?);
    let expires = ClusterTime(expires.parse().map_err(|_| AuthError::BadToken)?);
    let given = hex::decode(given).map_err(|_| AuthError::BadToken)?;
    // Compared in constant time.
    mac(key, user, revision, expires)
        .verify_slice(&given)
        .map_err(|_| AuthError::BadToken)?;
    match auth.user(user) {
        Some(found) if found.revision == revision => {}
        _ => return Err(AuthError::Revoked(user.to_string())),
    }
    if now > expires {
        return Err(AuthError::Expired(expires.0));
    }
    Ok(Principal(user.to_string()))
}

/// The principal of a call while authentication is enforced: its token's
/// user, else its client certificate's user. `Ok(None)` while it is not.
pub fn principal_of(
    auth: &AuthTable,
    credentials: &Credentials,
    now: ClusterTime,
) -> Result<Option<Principal>, AuthError> {
    // A revoked certificate is refused whether or not authentication is
    // enforced: without it, the certificate is what lets a client in.
    if let Some(serial) = &credentials.certificate_serial
        && auth.is_revoked(serial)
    {
        return Err(AuthError::CertificateRevoked(oncekv_state::serial_hex(
            serial,
        )));
    }
    if !auth.is_enabled() {
        return Ok(None);
    }
    if let Some(token) = &credentials.token {
        return check_token(auth, token, now).map(Some);
    }
    if let Some(name) = &credentials.certificate_user {
        if auth.user(name).is_some() {
            return Ok(Some(Principal(name.clone())));
        }
        return Err(AuthError::UnknownCertificateUser(name.clone()));
    }
    Err(AuthError::Missing)
}

/// Hashes a password with argon2id and a random salt (slow on purpose:
/// call it off the async threads).
pub fn hash_password(password: &str) -> Result<String, String> {
    let salt_bytes = crate::raft::runtime::secret_bits().to_be_bytes();
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| e.to_string())?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| e.to_string())
}

/// Whether `password` matches the stored `hash` (slow on purpose).
pub fn verify_password(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// A password hash made as every stored one is (argon2id, the node's
/// parameters, a random salt) of a password nobody knows: an unknown
/// user's password is checked against it, so that the check costs the
/// same. Made once per process, on first use (call it off the async
/// threads).
pub fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let password = format!("{:032x}", crate::raft::runtime::secret_bits());
        hash_password(&password).unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot make the dummy password hash");
            String::new()
        })
    })
}

/// Why a login gave no token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// Refused before its password was checked: too many failed logins
    /// of its user name or from its address, or too many logins waiting
    /// ([`crate::login_guard`]).
    #[error("{0}")]
    Refused(#[from] LoginRefused),
    /// Not carried out (not the leader, authentication not enabled, a
    /// wrong user name or password, ...).
    #[error("{0}")]
    Failed(#[from] WriteError),
}

/// Replaces the passwords an auth change carries by their hashes, off the
/// async threads (what the node does before proposing it).
pub async fn hash_passwords(command: &mut oncekv_state::Command) -> Result<(), WriteError> {
    use oncekv_state::{AuthCommand, Command};
    let password = match command {
        Command::Auth(
            AuthCommand::UserAdd { password_hash, .. }
            | AuthCommand::UserPasswd { password_hash, .. },
        ) => password_hash,
        _ => return Ok(()),
    };
    let Some(clear) = password.take() else {
        return Ok(());
    };
    if clear.is_empty() {
        let reason =
            "a password may not be empty (leave it out for a certificate-only user)".to_string();
        return Err(WriteError::Invalid(
            oncekv_state::Rejection::InvalidAuth { reason }.into(),
        ));
    }
    let _slot = crate::login_guard::guard()
        .hashing_slot()
        .await
        .map_err(|_| WriteError::Unavailable("shutting down".to_string()))?;
    let hashed = tokio::task::spawn_blocking(move || hash_password(&clear))
        .await
        .map_err(|e| WriteError::Unavailable(e.to_string()))?
        .map_err(WriteError::Unavailable)?;
    *password = Some(hashed);
    Ok(())
}

/// A fresh token key, drawn by the leader into the entry enabling
/// authentication.
pub fn draw_token_key() -> TokenKey {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&crate::raft::runtime::secret_bits().to_be_bytes());
    key[16..].copy_from_slice(&crate::raft::runtime::secret_bits().to_be_bytes());
    TokenKey(key)
}

/// When `token` stops being accepted, in cluster time, read from the
/// token itself (unchecked: [`check_token`] decides whether it holds).
/// A watch checks its user's right again then.
pub fn token_expires(token: &str) -> Option<ClusterTime> {
    let rest = token.strip_prefix("v1.")?;
    let mut tail = rest.rsplitn(4, '.');
    let _mac = tail.next()?;
    tail.next()?.parse().ok().map(ClusterTime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_state::AuthCommand;

    fn enabled() -> AuthTable {
        let mut auth = AuthTable::default();
        let commands = [
            AuthCommand::UserAdd {
                name: "a.b".into(),
                password_hash: Some(hash_password("pw").unwrap()),
            },
            AuthCommand::UserGrantRole {
                user: "a.b".into(),
                role: "admin".into(),
            },
            AuthCommand::Enable {
                token_key: TokenKey([3; 32]),
            },
        ];
        for (i, command) in commands.iter().enumerate() {
            auth.apply(command, LogIndex(i as u64 + 1)).unwrap();
        }
        auth
    }

    #[test]
    fn a_token_names_its_user_until_it_expires_or_the_password_changes() {
        let mut auth = enabled();
        let revision = auth.user("a.b").unwrap().revision;
        let token = issue_token(auth.token_key().unwrap(), "a.b", revision, ClusterTime(100));
        assert_eq!(
            check_token(&auth, &token, ClusterTime(50)),
            Ok(Principal("a.b".into()))
        );
        assert_eq!(
            check_token(&auth, &token, ClusterTime(101)),
            Err(AuthError::Expired(100))
        );
        assert_eq!(token_expires(&token), Some(ClusterTime(100)));
        assert_eq!(token_expires("garbage"), None);
        let forged = token.replace(".100.", ".999999.");
        assert_eq!(
            check_token(&auth, &forged, ClusterTime(50)),
            Err(AuthError::BadToken)
        );
        let other_key = issue_token(&TokenKey([4; 32]), "a.b", revision, ClusterTime(100));
        assert_eq!(
            check_token(&auth, &other_key, ClusterTime(50)),
            Err(AuthError::BadToken)
        );
        assert_eq!(
            check_token(&auth, "garbage", ClusterTime(50)),
            Err(AuthError::BadToken)
        );
        auth.apply(
            &AuthCommand::UserPasswd {
                name: "a.b".into(),
                password_hash: Some(hash_password("new").unwrap()),
            },
            LogIndex(10),
        )
        .unwrap();
        assert_eq!(
            check_token(&auth, &token, ClusterTime(50)),
            Err(AuthError::Revoked("a.b".into()))
        );
    }

    #[test]
    fn passwords_are_salted_and_verified() {
        let first = hash_password("secret").unwrap();
        let second = hash_password("secret").unwrap();
        assert_ne!(first, second, "a random salt each time");
        assert!(verify_password(&first, "secret"));
        assert!(!verify_password(&first, "Secret"));
        assert!(!verify_password("not a hash", "secret"));
    }

    /// Given a login token and a client certificate, the call is the
    /// token's user's (as docs/security.md says); the certificate still
    /// has to be valid and not revoked.
    #[test]
    fn a_token_wins_over_a_client_certificate() {
        let mut auth = enabled();
        let add = AuthCommand::UserAdd {
            name: "eve".into(),
            password_hash: None,
        };
        auth.apply(&add, LogIndex(10)).unwrap();
        let revision = auth.user("eve").unwrap().revision;
        let token = issue_token(&TokenKey([3; 32]), "eve", revision, ClusterTime(1_000));
        let both = Credentials {
            token: Some(token),
            certificate_user: Some("a.b".into()),
            certificate_serial: Some(vec![7]),
        };
        assert_eq!(
            principal_of(&auth, &both, ClusterTime(0)),
            Ok(Some(Principal("eve".into())))
        );
        let revoke = AuthCommand::CertificateRevoke { serial: vec![7] };
        auth.apply(&revoke, LogIndex(11)).unwrap();
        assert_eq!(
            principal_of(&auth, &both, ClusterTime(0)),
            Err(AuthError::CertificateRevoked("07".into()))
        );
    }

    #[test]
    fn without_enforcement_nobody_is_needed_and_with_it_someone_is() {
        let auth = AuthTable::default();
        assert_eq!(
            principal_of(&auth, &Credentials::default(), ClusterTime(0)),
            Ok(None)
        );
        let auth = enabled();
        assert_eq!(
            principal_of(&auth, &Credentials::default(), ClusterTime(0)),
            Err(AuthError::Missing)
        );
        let by_certificate = Credentials {
            token: None,
            certificate_user: Some("a.b".into()),
            certificate_serial: Some(vec![0x0a]),
        };
        assert_eq!(
            principal_of(&auth, &by_certificate, ClusterTime(0)),
            Ok(Some(Principal("a.b".into())))
        );
        let stranger = Credentials {
            token: None,
            certificate_user: Some("eve".into()),
            certificate_serial: None,
        };
        assert!(principal_of(&auth, &stranger, ClusterTime(0)).is_err());
        // A revoked certificate is refused, enforced or not.
        let mut auth = auth;
        let revoke = AuthCommand::CertificateRevoke { serial: vec![0x0a] };
        auth.apply(&revoke, LogIndex(9)).unwrap();
        assert_eq!(
            principal_of(&auth, &by_certificate, ClusterTime(0)),
            Err(AuthError::CertificateRevoked("0A".into()))
        );
        auth.apply(&AuthCommand::Disable, LogIndex(10)).unwrap();
        assert_eq!(
            principal_of(&auth, &by_certificate, ClusterTime(0)),
            Err(AuthError::CertificateRevoked("0A".into()))
        );
    }
}
