//! [`AuthTable`]: users, roles and the key permissions roles grant, whether
//! authentication is enforced, and the key that signs login tokens. Part of
//! the replicated state and its snapshot, changed only by [`AuthCommand`]s,
//! which only an admin may send once authentication is enabled. Leases have
//! owners ([`AuthTable::may_use_lease`]): while authentication is enforced
//! a lease is its owner's and an admin's to use, whatever keys a user may
//! write.
//!
//! Passwords arrive hashed (the node hashes them with a slow hash before
//! proposing), so applying stays cheap and pure. Every table is bounded in
//! count and so in bytes: [`USERS_MAX`] users of at most [`ROLES_PER_USER_MAX`]
//! roles, [`ROLES_MAX`] roles of at most [`PERMISSIONS_PER_ROLE_MAX`]
//! permissions, names of at most [`NAME_BYTES_MAX`] bytes, password hashes of
//! at most [`PASSWORD_HASH_BYTES_MAX`] bytes and keys within the store's key
//! limit, and all of it within [`AUTH_BYTES_MAX`] bytes: a change past a
//! bound is refused, nothing is evicted.

use crate::ids::{LogIndex, Principal, TokenKey};
use crate::key_range::KeyRange;
use crate::refusal::Rejection;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The built-in role that may do everything: read and write every key,
/// change membership and authentication, see detailed status.
pub const ADMIN_ROLE: &str = "admin";
/// Most users.
pub const USERS_MAX: usize = 1024;
/// Most roles (besides `admin`).
pub const ROLES_MAX: usize = 1024;
/// Most roles one user holds.
pub const ROLES_PER_USER_MAX: usize = 64;
/// Most permissions one role grants.
pub const PERMISSIONS_PER_ROLE_MAX: usize = 256;
/// Longest user or role name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;
/// Longest password hash (a PHC string), in bytes.
pub const PASSWORD_HASH_BYTES_MAX: usize = 256;
/// Most bytes the users and roles may hold in all, as
/// [`AuthTable::weight_bytes`] counts them: a change past it is refused.
pub const AUTH_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Most client certificates revoked at once.
pub const REVOKED_CERTIFICATES_MAX: usize = 10_000;
/// Longest certificate serial number, in bytes (RFC 5280 allows 20).
pub const SERIAL_BYTES_MAX: usize = 20;
/// What the budget counts for each user, role or permission beyond its
/// names, hash and key (its slot and allocations).
const AUTH_ENTRY_OVERHEAD_BYTES: u64 = 64;

/// What a permission allows on its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Get and scan.
    Read,
    /// Put, delete and append (and the lease revoke that deletes keys).
    Write,
    /// Both.
    ReadWrite,
}

impl Access {
    /// Whether this access includes all of `need`.
    pub fn includes(self, need: Access) -> bool {
        match need {
            Access::Read => matches!(self, Access::Read | Access::ReadWrite),
            Access::Write => matches!(self, Access::Write | Access::ReadWrite),
            Access::ReadWrite => self == Access::ReadWrite,
        }
    }

    /// Its lowercase name, as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::ReadWrite => "readwrite",
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Access to one key, or to every key starting with a prefix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Permission {
    /// What it allows.
    pub access: Access,
    /// The key, or the prefix.
    pub key: Vec<u8>,
    /// Whether `key` is a prefix.
    pub prefix: bool,
}

impl Permission {
    fn covers_key(&self, key: &[u8]) -> bool {
        if self.prefix {
            key.starts_with(&self.key)
        } else {
            key == self.key.as_slice()
        }
    }

    /// Whether every key starting with `prefix` is covered.
    fn covers_prefix(&self, prefix: &[u8]) -> bool {
        self.prefix && prefix.starts_with(&self.key)
    }

    /// Whether every key in `range` is covered.
    fn covers_range(&self, range: &KeyRange) -> bool {
        let granted = if self.prefix {
            KeyRange::prefix(self.key.as_slice())
        } else {
            KeyRange::one(self.key.as_slice())
        };
        range.is_within(&granted)
    }

    fn same_target(&self, key: &[u8], prefix: bool) -> bool {
        self.key == key && self.prefix == prefix
    }
}

/// A named set of permissions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    /// What it grants.
    pub permissions: Vec<Permission>,
}

/// A user: a password hash and the roles it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// Its password, hashed (a PHC string); `None`: it logs in only with a
    /// client certificate.
    pub password_hash: Option<String>,
    /// The roles it holds.
    pub roles: BTreeSet<String>,
    /// The index of the entry that last changed its password or existence:
    /// a login token names it, so a new password or a re-created user
    /// voids older tokens.
    pub revision: LogIndex,
}

/// A change to users, roles or enforcement.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthCommand {
    /// Start enforcing authentication (refused unless a user holds
    /// `admin`). The leader draws the token key into the entry.
    Enable {
        /// Signs login tokens from now on.
        token_key: TokenKey,
    },
    /// Stop enforcing: every request is allowed.
    Disable,
    /// Add a user.
    UserAdd {
        /// Its name.
        name: String,
        /// Its password, hashed; `None` for a certificate-only user.
        password_hash: Option<String>,
    },
    /// Delete a user (its sessions are closed and its idempotency keys
    /// forgotten with it).
    UserDelete {
        /// Its name.
        name: String,
    },
    /// Change a user's password (voids its tokens).
    UserPasswd {
        /// Its name.
        name: String,
        /// The new password, hashed.
        password_hash: Option<String>,
    },
    /// Give a user a role.
    UserGrantRole {
        /// The user.
        user: String,
        /// The role.
        role: String,
    },
    /// Take a role from a user.
    UserRevokeRole {
        /// The user.
        user: String,
        /// The role.
        role: String,
    },
    /// Add a role without permissions.
    RoleAdd {
        /// Its name.
        name: String,
    },
    /// Delete a role (and take it from every user).
    RoleDelete {
        /// Its name.
        name: String,
    },
    /// Add (or replace the access of) a permission of a role.
    RoleGrant {
        /// The role.
        role: String,
        /// The permission.
        permission: Permission,
    },
    /// Remove a role's permission on a key or prefix.
    RoleRevoke {
        /// The role.
        role: String,
        /// The key or prefix.
        key: Vec<u8>,
        /// Whether `key` is a prefix.
        prefix: bool,
    },
    /// Close a user's sessions and forget its idempotency keys, freeing
    /// their records (the user stays; its retries of requests made before
    /// are no longer deduplicated). The user need not exist.
    UserPurge {
        /// Its name.
        name: String,
    },
    /// Revoke the client certificate with this serial number: a call
    /// over a connection that presented it is refused from then on.
    CertificateRevoke {
        /// The serial number's bytes (big-endian, as in the certificate).
        serial: Vec<u8>,
    },
    /// Take a certificate serial number off the revocation list. The
    /// last variant: postcard numbers every earlier one as before.
    CertificateUnrevoke {
        /// The serial number's bytes.
        serial: Vec<u8>,
    },
}

impl fmt::Debug for AuthCommand {
    /// Names and shapes only: no password hash or token key in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthCommand::Enable { .. } => f.write_str("Enable"),
            AuthCommand::Disable => f.write_str("Disable"),
            AuthCommand::UserAdd { name, .. } => write!(f, "UserAdd({name:?})"),
            AuthCommand::UserDelete { name } => write!(f, "UserDelete({name:?})"),
            AuthCommand::UserPurge { name } => write!(f, "UserPurge({name:?})"),
            AuthCommand::CertificateRevoke { serial } => {
                write!(f, "CertificateRevoke({})", serial_hex(serial))
            }
            AuthCommand::CertificateUnrevoke { serial } => {
                write!(f, "CertificateUnrevoke({})", serial_hex(serial))
            }
            AuthCommand::UserPasswd { name, .. } => write!(f, "UserPasswd({name:?})"),
            AuthCommand::UserGrantRole { user, role } => {
                write!(f, "UserGrantRole({user:?}, {role:?})")
            }
            AuthCommand::UserRevokeRole { user, role } => {
                write!(f, "UserRevokeRole({user:?}, {role:?})")
            }
            AuthCommand::RoleAdd { name } => write!(f, "RoleAdd({name:?})"),
            AuthCommand::RoleDelete { name } => write!(f, "RoleDelete({name:?})"),
            AuthCommand::RoleGrant { role, permission } => {
                write!(f, "RoleGrant({role:?}, {permission:?})")
            }
            AuthCommand::RoleRevoke { role, key, prefix } => {
                write!(f, "RoleRevoke({role:?}, {key:?}, prefix={prefix})")
            }
        }
    }
}

impl AuthCommand {
    /// A short lowercase name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            AuthCommand::Enable { .. } => "auth_enable",
            AuthCommand::Disable => "auth_disable",
            AuthCommand::UserAdd { .. } => "user_add",
            AuthCommand::UserDelete { .. } => "user_delete",
            AuthCommand::UserPurge { .. } => "user_purge",
            AuthCommand::CertificateRevoke { .. } => "certificate_revoke",
            AuthCommand::CertificateUnrevoke { .. } => "certificate_unrevoke",
            AuthCommand::UserPasswd { .. } => "user_passwd",
            AuthCommand::UserGrantRole { .. } => "user_grant_role",
            AuthCommand::UserRevokeRole { .. } => "user_revoke_role",
            AuthCommand::RoleAdd { .. } => "role_add",
            AuthCommand::RoleDelete { .. } => "role_delete",
            AuthCommand::RoleGrant { .. } => "role_grant",
            AuthCommand::RoleRevoke { .. } => "role_revoke",
        }
    }

    /// The bytes of names, hashes and keys it carries.
    pub fn payload_bytes(&self) -> u64 {
        let hash = |h: &Option<String>| h.as_ref().map_or(0, String::len);
        let bytes = match self {
            AuthCommand::Enable { .. } | AuthCommand::Disable => 0,
            AuthCommand::UserAdd {
                name,
                password_hash,
            }
            | AuthCommand::UserPasswd {
                name,
                password_hash,
            } => name.len() + hash(password_hash),
            AuthCommand::UserDelete { name }
            | AuthCommand::UserPurge { name }
            | AuthCommand::RoleAdd { name }
            | AuthCommand::RoleDelete { name } => name.len(),
            AuthCommand::UserGrantRole { user, role }
            | AuthCommand::UserRevokeRole { user, role } => user.len() + role.len(),
            AuthCommand::RoleGrant { role, permission } => role.len() + permission.key.len(),
            AuthCommand::RoleRevoke { role, key, .. } => role.len() + key.len(),
            AuthCommand::CertificateRevoke { serial }
            | AuthCommand::CertificateUnrevoke { serial } => serial.len(),
        };
        bytes as u64
    }

    /// Checks names and hash lengths, whatever the state: what the node
    /// refuses before proposing. `key_max` is the store's key limit.
    pub fn check(&self, key_max: usize) -> Result<(), Rejection> {
        let hash = |h: &Option<String>| match h {
            Some(h) if h.is_empty() || h.len() > PASSWORD_HASH_BYTES_MAX => {
                Err(Rejection::InvalidAuth {
                    reason: format!("a password hash must be 1..={PASSWORD_HASH_BYTES_MAX} bytes"),
                })
            }
            _ => Ok(()),
        };
        let key = |k: &[u8]| {
            if k.len() > key_max {
                Err(Rejection::KeyLength {
                    bytes: k.len(),
                    max: key_max,
                })
            } else {
                Ok(())
            }
        };
        match self {
            AuthCommand::Enable { .. } | AuthCommand::Disable => Ok(()),
            AuthCommand::UserAdd {
                name,
                password_hash,
            }
            | AuthCommand::UserPasswd {
                name,
                password_hash,
            } => {
                check_name("user", name)?;
                hash(password_hash)
            }
            AuthCommand::UserDelete { name } | AuthCommand::UserPurge { name } => {
                check_name("user", name)
            }
            AuthCommand::RoleAdd { name } | AuthCommand::RoleDelete { name } => {
                check_name("role", name)
            }
            AuthCommand::UserGrantRole { user, role }
            | AuthCommand::UserRevokeRole { user, role } => {
                check_name("user", user)?;
                check_name("role", role)
            }
            AuthCommand::RoleGrant { role, permission } => {
                check_name("role", role)?;
                if permission.key.is_empty() && !permission.prefix {
                    return Err(Rejection::InvalidAuth {
                        reason:
                            "a permission names a key, or a prefix (the empty prefix is every key)"
                                .to_string(),
                    });
                }
                key(&permission.key)
            }
            AuthCommand::RoleRevoke { role, key: k, .. } => {
                check_name("role", role)?;
                key(k)
            }
            AuthCommand::CertificateRevoke { serial }
            | AuthCommand::CertificateUnrevoke { serial } => check_serial(serial),
        }
    }
}

/// A certificate serial number: 1..=[`SERIAL_BYTES_MAX`] bytes.
fn check_serial(serial: &[u8]) -> Result<(), Rejection> {
    if serial.is_empty() || serial.len() > SERIAL_BYTES_MAX {
        return Err(Rejection::InvalidAuth {
            reason: format!(
                "a certificate serial number is 1..={SERIAL_BYTES_MAX} bytes, got {}",
                serial.len()
            ),
        });
    }
    Ok(())
}

/// A serial number as `openssl x509 -serial` prints it: uppercase hex.
pub fn serial_hex(serial: &[u8]) -> String {
    serial.iter().map(|byte| format!("{byte:02X}")).collect()
}

/// A user or role name: 1..=[`NAME_BYTES_MAX`] bytes of ASCII letters,
/// digits, `.`, `_`, `-` and `@`.
pub fn check_name(what: &str, name: &str) -> Result<(), Rejection> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@');
    if name.is_empty() || name.len() > NAME_BYTES_MAX || !name.chars().all(allowed) {
        return Err(Rejection::InvalidAuth {
            reason: format!(
                "a {what} name is 1..={NAME_BYTES_MAX} ASCII letters, digits, '.', '_', '-' or '@', got {name:?}"
            ),
        });
    }
    Ok(())
}

/// What an auth query answers: enforcement, users and roles (never password
/// hashes or the token key).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthView {
    /// Whether authentication is enforced.
    pub enabled: bool,
    /// Users by name, with their roles and whether they have a password.
    pub users: Vec<UserView>,
    /// Roles by name, with their permissions (`admin` first, without any:
    /// it allows everything).
    pub roles: Vec<(String, Vec<Permission>)>,
    /// The serial numbers of the revoked client certificates, in order.
    pub revoked_certificates: Vec<Vec<u8>>,
}

/// A user as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    /// Its name.
    pub name: String,
    /// Its roles.
    pub roles: Vec<String>,
    /// Whether it can log in with a password.
    pub has_password: bool,
}

/// Users, roles and enforcement.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthTable {
    enabled: bool,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
    token_key: Option<TokenKey>,
    /// Serial numbers of revoked client certificates. Written in
    /// snapshots after the body (format 6), so earlier formats' tables
    /// still decode.
    #[serde(skip)]
    revoked: BTreeSet<Vec<u8>>,
}

impl AuthTable {
    /// Whether authentication is enforced.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Whether the client certificate with this serial number is revoked.
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.revoked.contains(serial)
    }

    /// The revoked certificates' serial numbers, in order.
    pub fn revoked_certificates(&self) -> &BTreeSet<Vec<u8>> {
        &self.revoked
    }

    /// The table with this revocation list (from a snapshot).
    pub(crate) fn with_revoked(mut self, revoked: BTreeSet<Vec<u8>>) -> AuthTable {
        self.revoked = revoked;
        self
    }

    /// The user of this name.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// Every user's name, in order (without copying the table).
    pub fn user_names(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Every role's name, the built-in admin role's first, then in order.
    pub fn role_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(ADMIN_ROLE).chain(self.roles.keys().map(String::as_str))
    }

    /// What role `name` grants (nothing listed for the built-in admin
    /// role, which grants everything), if it exists.
    pub fn role_permissions(&self, name: &str) -> Option<&[Permission]> {
        if name == ADMIN_ROLE {
            return Some(&[]);
        }
        self.roles.get(name).map(|role| role.permissions.as_slice())
    }

    /// The key that signs login tokens (set once authentication was first
    /// enabled; redrawn at each enable).
    pub fn token_key(&self) -> Option<&TokenKey> {
        self.token_key.as_ref()
    }

    /// How many users and roles exist.
    pub fn counts(&self) -> (usize, usize) {
        (self.users.len(), self.roles.len())
    }

    /// Whether `principal` may do anything: always while authentication is
    /// off; otherwise a user holding `admin`.
    pub fn is_admin(&self, principal: Option<&Principal>) -> bool {
        if !self.enabled {
            return true;
        }
        principal
            .and_then(|p| self.users.get(&p.0))
            .is_some_and(|user| user.roles.contains(ADMIN_ROLE))
    }

    /// Whether `principal` may use a lease owned by `owner` (renew,
    /// revoke, list it or attach keys to it): always while authentication
    /// is off; otherwise its owner, or an admin. A lease without an owner
    /// (granted while authentication was off, or before leases had owners)
    /// is anyone's.
    pub fn may_use_lease(&self, principal: Option<&Principal>, owner: Option<&Principal>) -> bool {
        match owner {
            None => true,
            Some(owner) => !self.enabled || principal == Some(owner) || self.is_admin(principal),
        }
    }

    fn permissions<'a>(&'a self, user: &'a User) -> impl Iterator<Item = &'a Permission> + 'a {
        user.roles
            .iter()
            .filter_map(|role| self.roles.get(role))
            .flat_map(|role| role.permissions.iter())
    }

    /// Whether `principal` has `need` on `key`.
    pub fn allows_key(&self, principal: Option<&Principal>, key: &[u8], need: Access) -> bool {
        self.allows(principal, need, |p| p.covers_key(key))
    }

    /// Whether `principal` has `need` on every key starting with `prefix`.
    pub fn allows_prefix(
        &self,
        principal: Option<&Principal>,
        prefix: &[u8],
        need: Access,
    ) -> bool {
        self.allows(principal, need, |p| p.covers_prefix(prefix))
    }

    /// Whether `principal` has `need` on every key in `range` (from one
    /// grant: grants are not joined to cover it).
    pub fn allows_range(
        &self,
        principal: Option<&Principal>,
        range: &KeyRange,
        need: Access,
    ) -> bool {
        self.allows(principal, need, |p| p.covers_range(range))
    }

    fn allows(
        &self,
        principal: Option<&Principal>,
        need: Access,
        covers: impl Fn(&Permission) -> bool,
    ) -> bool {
        if self.is_admin(principal) {
            return true;
        }
        let Some(user) = principal.and_then(|p| self.users.get(&p.0)) else {
            return false;
        };
        // Read and write may come from different grants.
        let mut read = false;
        let mut write = false;
        for permission in self.permissions(user).filter(|p| covers(p)) {
            read |= permission.access.includes(Access::Read);
            write |= permission.access.includes(Access::Write);
        }
        match need {
            Access::Read => read,
            Access::Write => write,
            Access::ReadWrite => read && write,
        }
    }

    /// The listing an auth query answers.
    pub fn view(&self) -> AuthView {
        let mut roles = vec![(ADMIN_ROLE.to_string(), Vec::new())];
        roles.extend(
            self.roles
                .iter()
                .map(|(name, role)| (name.clone(), role.permissions.clone())),
        );
        AuthView {
            enabled: self.enabled,
            users: self
                .users
                .iter()
                .map(|(name, user)| UserView {
                    name: name.clone(),
                    roles: user.roles.iter().cloned().collect(),
                    has_password: user.password_hash.is_some(),
                })
                .collect(),
            roles,
            revoked_certificates: self.revoked.iter().cloned().collect(),
        }
    }

    fn has_admin_user(&self, without: Option<(&str, &str)>) -> bool {
        self.users.iter().any(|(name, user)| {
            user.roles.contains(ADMIN_ROLE)
                && without.is_none_or(|(u, r)| !(u == name && r == ADMIN_ROLE))
        })
    }

    fn user_mut(&mut self, name: &str) -> Result<&mut User, Rejection> {
        self.users
            .get_mut(name)
            .ok_or_else(|| Rejection::UserNotFound {
                name: name.to_string(),
            })
    }

    fn role_mut(&mut self, name: &str) -> Result<&mut Role, Rejection> {
        if name == ADMIN_ROLE {
            return Err(Rejection::BuiltInRole);
        }
        self.roles
            .get_mut(name)
            .ok_or_else(|| Rejection::RoleNotFound {
                name: name.to_string(),
            })
    }

    /// The bytes the users and roles hold, as the budget counts them.
    pub fn weight_bytes(&self) -> u64 {
        let len = |text: &str| text.len() as u64 + AUTH_ENTRY_OVERHEAD_BYTES;
        let users: u64 = self
            .users
            .iter()
            .map(|(name, user)| {
                len(name)
                    + user.password_hash.as_deref().map_or(0, |h| h.len() as u64)
                    + user.roles.iter().map(|r| len(r)).sum::<u64>()
            })
            .sum();
        let roles: u64 = self
            .roles
            .iter()
            .map(|(name, role)| {
                len(name)
                    + role
                        .permissions
                        .iter()
                        .map(|p| p.key.len() as u64 + AUTH_ENTRY_OVERHEAD_BYTES)
                        .sum::<u64>()
            })
            .sum();
        let revoked: u64 = self
            .revoked
            .iter()
            .map(|serial| serial.len() as u64 + AUTH_ENTRY_OVERHEAD_BYTES)
            .sum();
        users + roles + revoked
    }

    /// Applies a change at `index`. A refusal changes nothing: a change
    /// that would take the table past [`AUTH_BYTES_MAX`] is refused.
    pub fn apply(&mut self, command: &AuthCommand, index: LogIndex) -> Result<(), Rejection> {
        let mut next = self.clone();
        next.apply_within_counts(command, index)?;
        let bytes = next.weight_bytes();
        if bytes > AUTH_BYTES_MAX && bytes > self.weight_bytes() {
            return Err(Rejection::AuthBytes {
                max: AUTH_BYTES_MAX,
            });
        }
        *self = next;
        Ok(())
    }

    fn apply_within_counts(
        &mut self,
        command: &AuthCommand,
        index: LogIndex,
    ) -> Result<(), Rejection> {
        match command {
            AuthCommand::Enable { token_key } => {
                if !self.has_admin_user(None) {
                    return Err(Rejection::NoAdmin);
                }
                self.enabled = true;
                self.token_key = Some(*token_key);
            }
            AuthCommand::Disable => self.enabled = false,
            AuthCommand::UserAdd {
                name,
                password_hash,
            } => {
                if self.users.contains_key(name) {
                    return Err(Rejection::UserExists { name: name.clone() });
                }
                if self.users.len() >= USERS_MAX {
                    return Err(Rejection::TooManyUsers {
                        max: USERS_MAX as u64,
                    });
                }
                self.users.insert(
                    name.clone(),
                    User {
                        password_hash: password_hash.clone(),
                        roles: BTreeSet::new(),
                        revision: index,
                    },
                );
            }
            AuthCommand::UserDelete { name } => {
                let is_admin = self
                    .users
                    .get(name)
                    .ok_or_else(|| Rejection::UserNotFound { name: name.clone() })?
                    .roles
                    .contains(ADMIN_ROLE);
                if self.enabled && is_admin && !self.has_admin_user(Some((name, ADMIN_ROLE))) {
                    return Err(Rejection::NoAdmin);
                }
                self.users.remove(name);
            }
            // Sessions and keys are the machine's; the table has nothing
            // of a purge to change.
            AuthCommand::UserPurge { name } => check_name("user", name)?,
            AuthCommand::CertificateRevoke { serial } => {
                check_serial(serial)?;
                if !self.revoked.contains(serial) && self.revoked.len() >= REVOKED_CERTIFICATES_MAX
                {
                    return Err(Rejection::InvalidAuth {
                        reason: format!(
                            "{REVOKED_CERTIFICATES_MAX} certificates are revoked already: \
                             renew the CA to start a new list"
                        ),
                    });
                }
                self.revoked.insert(serial.clone());
            }
            AuthCommand::CertificateUnrevoke { serial } => {
                if !self.revoked.remove(serial) {
                    return Err(Rejection::InvalidAuth {
                        reason: format!(
                            "no certificate with serial number {} is revoked",
                            serial_hex(serial)
                        ),
                    });
                }
            }
            AuthCommand::UserPasswd {
                name,
                password_hash,
            } => {
                let user = self.user_mut(name)?;
                user.password_hash = password_hash.clone();
                user.revision = index;
            }
            AuthCommand::UserGrantRole { user, role } => {
                if role != ADMIN_ROLE && !self.roles.contains_key(role) {
                    return Err(Rejection::RoleNotFound { name: role.clone() });
                }
                let user = self.user_mut(user)?;
                if !user.roles.contains(role) && user.roles.len() >= ROLES_PER_USER_MAX {
                    return Err(Rejection::TooManyRoles {
                        max: ROLES_PER_USER_MAX as u64,
                    });
                }
                user.roles.insert(role.clone());
            }
            AuthCommand::UserRevokeRole { user, role } => {
                if self.enabled
                    && role == ADMIN_ROLE
                    && !self.has_admin_user(Some((user.as_str(), ADMIN_ROLE)))
                {
                    return Err(Rejection::NoAdmin);
                }
                let held = self.user_mut(user)?;
                if !held.roles.remove(role) {
                    return Err(Rejection::RoleNotFound { name: role.clone() });
                }
            }
            AuthCommand::RoleAdd { name } => {
                if name == ADMIN_ROLE || self.roles.contains_key(name) {
                    return Err(Rejection::RoleExists { name: name.clone() });
                }
                if self.roles.len() >= ROLES_MAX {
                    return Err(Rejection::TooManyRoles {
                        max: ROLES_MAX as u64,
                    });
                }
                self.roles.insert(name.clone(), Role::default());
            }
            AuthCommand::RoleDelete { name } => {
                self.role_mut(name)?;
                self.roles.remove(name);
                for user in self.users.values_mut() {
                    user.roles.remove(name);
                }
            }
            AuthCommand::RoleGrant { role, permission } => {
                let role = self.role_mut(role)?;
                let held = role.permissions.len();
                let existing = role
                    .permissions
                    .iter_mut()
                    .find(|p| p.same_target(&permission.key, permission.prefix));
                match existing {
                    Some(existing) => existing.access = permission.access,
                    None if held >= PERMISSIONS_PER_ROLE_MAX => {
                        return Err(Rejection::TooManyPermissions {
                            max: PERMISSIONS_PER_ROLE_MAX as u64,
                        });
                    }
                    None => role.permissions.push(permission.clone()),
                }
            }
            AuthCommand::RoleRevoke { role, key, prefix } => {
                let role = self.role_mut(role)?;
                let before = role.permissions.len();
                role.permissions.retain(|p| !p.same_target(key, *prefix));
                if role.permissions.len() == before {
                    return Err(Rejection::PermissionNotFound);
                }
            }
        }
        Ok(())
    }

    /// Checks the table's bounds and references.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.users.len() > USERS_MAX || self.roles.len() > ROLES_MAX {
            return Err(format!(
                "{} users and {} roles exceed their bounds",
                self.users.len(),
                self.roles.len()
            ));
        }
        if self.weight_bytes() > AUTH_BYTES_MAX {
            return Err(format!(
                "users and roles hold {} bytes, over {AUTH_BYTES_MAX}",
                self.weight_bytes()
            ));
        }
        if self.enabled && (self.token_key.is_none() || !self.has_admin_user(None)) {
            return Err("enabled without a token key or an admin user".to_string());
        }
        for (name, user) in &self.users {
            if user.roles.len() > ROLES_PER_USER_MAX {
                return Err(format!("user {name:?} holds too many roles"));
            }
            if let Some(role) = user
                .roles
                .iter()
                .find(|r| r.as_str() != ADMIN_ROLE && !self.roles.contains_key(*r))
            {
                return Err(format!("user {name:?} holds unknown role {role:?}"));
            }
        }
        if let Some((name, _)) = self
            .roles
            .iter()
            .find(|(_, role)| role.permissions.len() > PERMISSIONS_PER_ROLE_MAX)
        {
            return Err(format!("role {name:?} grants too many permissions"));
        }
        if self.revoked.len() > REVOKED_CERTIFICATES_MAX
            || self
                .revoked
                .iter()
                .any(|serial| check_serial(serial).is_err())
        {
            return Err("the certificate revocation list is out of bounds".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(user: &str, role: &str, permission: Permission) -> AuthTable {
        let mut table = AuthTable::default();
        let hash = Some("$argon2id$x".to_string());
        let commands = [
            AuthCommand::UserAdd {
                name: "root".into(),
                password_hash: hash.clone(),
            },
            AuthCommand::UserGrantRole {
                user: "root".into(),
                role: ADMIN_ROLE.into(),
            },
            AuthCommand::UserAdd {
                name: user.into(),
                password_hash: hash,
            },
            AuthCommand::RoleAdd { name: role.into() },
            AuthCommand::RoleGrant {
                role: role.into(),
                permission,
            },
            AuthCommand::UserGrantRole {
                user: user.into(),
                role: role.into(),
            },
            AuthCommand::Enable {
                token_key: TokenKey([7; 32]),
            },
        ];
        for (i, command) in commands.iter().enumerate() {
            table.apply(command, LogIndex(i as u64 + 1)).unwrap();
        }
        table
    }

    #[test]
    fn names_and_one_roles_permissions_are_read_without_the_whole_view() {
        let permission = Permission {
            access: Access::Read,
            key: b"app/".to_vec(),
            prefix: true,
        };
        let table = table_with("alice", "app", permission.clone());
        let view = table.view();
        let users: Vec<&str> = table.user_names().collect();
        assert_eq!(users, ["alice", "root"]);
        assert_eq!(
            users,
            view.users
                .iter()
                .map(|u| u.name.as_str())
                .collect::<Vec<_>>()
        );
        let roles: Vec<&str> = table.role_names().collect();
        assert_eq!(
            roles,
            view.roles
                .iter()
                .map(|(r, _)| r.as_str())
                .collect::<Vec<_>>()
        );
        assert_eq!(table.role_permissions("app"), Some(&[permission][..]));
        assert_eq!(table.role_permissions(ADMIN_ROLE), Some(&[][..]));
        assert_eq!(table.role_permissions("nobody"), None);
    }

    #[test]
    fn a_lease_is_its_owners_and_the_admins_once_enforced() {
        let mut table = table_with(
            "alice",
            "app",
            Permission {
                access: Access::ReadWrite,
                key: b"app/".to_vec(),
                prefix: true,
            },
        );
        let alice = Principal("alice".into());
        let bob = Principal("bob".into());
        let root = Principal("root".into());
        let owned = Some(&alice);
        assert!(table.may_use_lease(Some(&alice), owned));
        assert!(table.may_use_lease(Some(&root), owned), "an admin");
        assert!(!table.may_use_lease(Some(&bob), owned));
        assert!(!table.may_use_lease(None, owned));
        // A lease without an owner is anyone's.
        assert!(table.may_use_lease(Some(&bob), None));
        // Not enforced: anyone's.
        table.apply(&AuthCommand::Disable, LogIndex(100)).unwrap();
        assert!(table.may_use_lease(Some(&bob), owned));
        assert!(table.may_use_lease(None, owned));
    }

    #[test]
    fn a_prefix_grant_covers_its_keys_and_narrower_scans_only() {
        let app = table_with(
            "alice",
            "app",
            Permission {
                access: Access::ReadWrite,
                key: b"app/".to_vec(),
                prefix: true,
            },
        );
        let alice = Principal("alice".into());
        let alice = Some(&alice);
        assert!(app.allows_key(alice, b"app/x", Access::ReadWrite));
        assert!(!app.allows_key(alice, b"other/x", Access::Read));
        assert!(app.allows_prefix(alice, b"app/sub/", Access::Read));
        assert!(!app.allows_prefix(alice, b"ap", Access::Read));
        assert!(!app.is_admin(alice));
        assert!(!app.allows_key(None, b"app/x", Access::Read));
        let root = Principal("root".into());
        assert!(app.is_admin(Some(&root)));
        assert!(app.allows_key(Some(&root), b"other/x", Access::Write));
    }

    #[test]
    fn read_only_grants_refuse_writes_and_an_exact_key_is_not_a_prefix() {
        let table = table_with(
            "bob",
            "reader",
            Permission {
                access: Access::Read,
                key: b"cfg".to_vec(),
                prefix: false,
            },
        );
        let bob = Principal("bob".into());
        assert!(table.allows_key(Some(&bob), b"cfg", Access::Read));
        assert!(!table.allows_key(Some(&bob), b"cfg", Access::Write));
        assert!(!table.allows_key(Some(&bob), b"cfg2", Access::Read));
        assert!(!table.allows_prefix(Some(&bob), b"cfg", Access::Read));
    }

    #[test]
    fn the_last_admin_cannot_go_while_enabled_and_enable_needs_one() {
        let mut table = AuthTable::default();
        assert_eq!(
            table.apply(
                &AuthCommand::Enable {
                    token_key: TokenKey([1; 32])
                },
                LogIndex(1)
            ),
            Err(Rejection::NoAdmin)
        );
        let mut table2 = table_with(
            "carol",
            "r",
            Permission {
                access: Access::Read,
                key: vec![],
                prefix: true,
            },
        );
        let refused = table2.apply(
            &AuthCommand::UserDelete {
                name: "root".into(),
            },
            LogIndex(20),
        );
        assert_eq!(refused, Err(Rejection::NoAdmin));
        let refused = table2.apply(
            &AuthCommand::UserRevokeRole {
                user: "root".into(),
                role: ADMIN_ROLE.into(),
            },
            LogIndex(21),
        );
        assert_eq!(refused, Err(Rejection::NoAdmin));
        assert!(table2.check_invariants().is_ok());
        table2.apply(&AuthCommand::Disable, LogIndex(22)).unwrap();
        table.apply(&AuthCommand::Disable, LogIndex(2)).unwrap();
        assert!(table.is_admin(None), "everyone is admin while auth is off");
    }

    #[test]
    fn a_full_byte_budget_refuses_and_keeps_what_is_there() {
        let mut table = AuthTable::default();
        let key = vec![b'k'; 4096];
        let mut index = 0;
        let mut next = || {
            index += 1;
            LogIndex(index)
        };
        let mut refused = None;
        'fill: for r in 0..ROLES_MAX {
            let role = format!("r{r}");
            table
                .apply(&AuthCommand::RoleAdd { name: role.clone() }, next())
                .unwrap();
            for p in 0..PERMISSIONS_PER_ROLE_MAX {
                let mut key = key.clone();
                key.extend_from_slice(p.to_string().as_bytes());
                let grant = AuthCommand::RoleGrant {
                    role: role.clone(),
                    permission: Permission {
                        access: Access::Read,
                        key,
                        prefix: false,
                    },
                };
                if let Err(why) = table.apply(&grant, next()) {
                    refused = Some(why);
                    break 'fill;
                }
            }
        }
        assert_eq!(
            refused,
            Some(Rejection::AuthBytes {
                max: AUTH_BYTES_MAX
            })
        );
        let before = table.clone();
        assert!(table.weight_bytes() <= AUTH_BYTES_MAX);
        assert!(table.check_invariants().is_ok());
        // Removing still works, and frees room.
        let revoke = AuthCommand::RoleDelete { name: "r0".into() };
        table.apply(&revoke, next()).unwrap();
        assert!(table.weight_bytes() < before.weight_bytes());
    }

    #[test]
    fn names_are_checked_before_proposing() {
        assert!(check_name("user", "alice.b-c_d@x").is_ok());
        for bad in ["", "a b", "ü", &"x".repeat(NAME_BYTES_MAX + 1)] {
            assert!(check_name("user", bad).is_err(), "{bad:?}");
        }
    }
}
