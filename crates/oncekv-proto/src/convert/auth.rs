//! Conversions of users, roles and permissions between the wire and the
//! state machine's model: auth changes, the auth listing and the auth
//! refusals. A password travels in clear in `UserPassword` (over TLS) and
//! sits in the model's `password_hash` field until the node hashes it
//! before proposing.

use super::{ConvertError, Result};
use crate::v1;
use oncekv_state::{Access, AuthCommand, AuthView, Permission, Rejection, TokenKey, UserView};

fn access_to_wire(access: Access) -> v1::Access {
    match access {
        Access::Read => v1::Access::Read,
        Access::Write => v1::Access::Write,
        Access::ReadWrite => v1::Access::ReadWrite,
    }
}

fn access_from_wire(access: i32) -> Result<Access> {
    match v1::Access::try_from(access).unwrap_or(v1::Access::Unspecified) {
        v1::Access::Read => Ok(Access::Read),
        v1::Access::Write => Ok(Access::Write),
        v1::Access::ReadWrite => Ok(Access::ReadWrite),
        v1::Access::Unspecified => Err(ConvertError::Missing("permission.access")),
    }
}

fn permission_to_wire(permission: &Permission) -> v1::Permission {
    v1::Permission {
        access: access_to_wire(permission.access).into(),
        key: permission.key.clone(),
        prefix: permission.prefix,
    }
}

fn permission_from_wire(permission: v1::Permission) -> Result<Permission> {
    Ok(Permission {
        access: access_from_wire(permission.access)?,
        key: permission.key,
        prefix: permission.prefix,
    })
}

/// An auth change from the wire. `Enable` gets the placeholder token key
/// (zeros): the leader draws the real one when it proposes the entry.
pub(super) fn change_from_wire(change: v1::AuthChange) -> Result<AuthCommand> {
    use v1::auth_change::Kind;
    Ok(
        match change.kind.ok_or(ConvertError::Missing("auth.kind"))? {
            Kind::Enable(_) => AuthCommand::Enable {
                token_key: TokenKey([0; 32]),
            },
            Kind::Disable(_) => AuthCommand::Disable,
            Kind::UserAdd(user) => AuthCommand::UserAdd {
                name: user.name,
                password_hash: user.password,
            },
            Kind::UserDelete(user) => AuthCommand::UserDelete { name: user.name },
            Kind::UserPurge(user) => AuthCommand::UserPurge { name: user.name },
            Kind::CertificateRevoke(certificate) => AuthCommand::CertificateRevoke {
                serial: certificate.serial,
            },
            Kind::CertificateUnrevoke(certificate) => AuthCommand::CertificateUnrevoke {
                serial: certificate.serial,
            },
            Kind::UserPasswd(user) => AuthCommand::UserPasswd {
                name: user.name,
                password_hash: user.password,
            },
            Kind::UserGrantRole(grant) => AuthCommand::UserGrantRole {
                user: grant.user,
                role: grant.role,
            },
            Kind::UserRevokeRole(revoke) => AuthCommand::UserRevokeRole {
                user: revoke.user,
                role: revoke.role,
            },
            Kind::RoleAdd(role) => AuthCommand::RoleAdd { name: role.name },
            Kind::RoleDelete(role) => AuthCommand::RoleDelete { name: role.name },
            Kind::RoleGrant(grant) => AuthCommand::RoleGrant {
                role: grant.role,
                permission: permission_from_wire(
                    grant
                        .permission
                        .ok_or(ConvertError::Missing("role_grant.permission"))?,
                )?,
            },
            Kind::RoleRevoke(revoke) => AuthCommand::RoleRevoke {
                role: revoke.role,
                key: revoke.key,
                prefix: revoke.prefix,
            },
        },
    )
}

/// An auth change for the wire (a client's: `password_hash` holds the
/// password, which the node hashes).
pub(super) fn change_to_wire(change: &AuthCommand) -> v1::AuthChange {
    use v1::auth_change::Kind;
    let kind = match change {
        AuthCommand::Enable { .. } => Kind::Enable(v1::Empty {}),
        AuthCommand::Disable => Kind::Disable(v1::Empty {}),
        AuthCommand::UserAdd {
            name,
            password_hash,
        } => Kind::UserAdd(v1::UserPassword {
            name: name.clone(),
            password: password_hash.clone(),
        }),
        AuthCommand::UserDelete { name } => Kind::UserDelete(v1::Name { name: name.clone() }),
        AuthCommand::UserPurge { name } => Kind::UserPurge(v1::Name { name: name.clone() }),
        AuthCommand::CertificateRevoke { serial } => {
            Kind::CertificateRevoke(v1::CertificateSerial {
                serial: serial.clone(),
            })
        }
        AuthCommand::CertificateUnrevoke { serial } => {
            Kind::CertificateUnrevoke(v1::CertificateSerial {
                serial: serial.clone(),
            })
        }
        AuthCommand::UserPasswd {
            name,
            password_hash,
        } => Kind::UserPasswd(v1::UserPassword {
            name: name.clone(),
            password: password_hash.clone(),
        }),
        AuthCommand::UserGrantRole { user, role } => Kind::UserGrantRole(v1::UserRole {
            user: user.clone(),
            role: role.clone(),
        }),
        AuthCommand::UserRevokeRole { user, role } => Kind::UserRevokeRole(v1::UserRole {
            user: user.clone(),
            role: role.clone(),
        }),
        AuthCommand::RoleAdd { name } => Kind::RoleAdd(v1::Name { name: name.clone() }),
        AuthCommand::RoleDelete { name } => Kind::RoleDelete(v1::Name { name: name.clone() }),
        AuthCommand::RoleGrant { role, permission } => Kind::RoleGrant(v1::RoleGrant {
            role: role.clone(),
            permission: Some(permission_to_wire(permission)),
        }),
        AuthCommand::RoleRevoke { role, key, prefix } => Kind::RoleRevoke(v1::RoleRevoke {
            role: role.clone(),
            key: key.clone(),
            prefix: *prefix,
        }),
    };
    v1::AuthChange { kind: Some(kind) }
}

/// The auth listing for the wire.
pub(super) fn view_to_wire(view: &AuthView) -> v1::AuthState {
    v1::AuthState {
        enabled: view.enabled,
        users: view
            .users
            .iter()
            .map(|user| v1::UserInfo {
                name: user.name.clone(),
                roles: user.roles.clone(),
                has_password: user.has_password,
            })
            .collect(),
        roles: view
            .roles
            .iter()
            .map(|(name, permissions)| v1::RoleInfo {
                name: name.clone(),
                permissions: permissions.iter().map(permission_to_wire).collect(),
            })
            .collect(),
        revoked_certificates: view.revoked_certificates.clone(),
    }
}

/// The auth listing from the wire.
pub(super) fn view_from_wire(view: v1::AuthState) -> Result<AuthView> {
    Ok(AuthView {
        enabled: view.enabled,
        users: view
            .users
            .into_iter()
            .map(|user| UserView {
                name: user.name,
                roles: user.roles,
                has_password: user.has_password,
            })
            .collect(),
        roles: view
            .roles
            .into_iter()
            .map(|role| {
                let permissions = role
                    .permissions
                    .into_iter()
                    .map(permission_from_wire)
                    .collect::<Result<Vec<_>>>()?;
                Ok((role.name, permissions))
            })
            .collect::<Result<Vec<_>>>()?,
        revoked_certificates: view.revoked_certificates,
    })
}

/// An auth refusal for the wire; `None` for the other refusals.
pub(super) fn rejection_to_wire(rejection: &Rejection) -> Option<v1::rejection::Kind> {
    use v1::rejection::Kind;
    let name = |name: &String| v1::Name { name: name.clone() };
    Some(match rejection {
        Rejection::UserExists { name: n } => Kind::UserExists(name(n)),
        Rejection::UserNotFound { name: n } => Kind::UserNotFound(name(n)),
        Rejection::RoleExists { name: n } => Kind::RoleExists(name(n)),
        Rejection::RoleNotFound { name: n } => Kind::RoleNotFound(name(n)),
        Rejection::NoAdmin => Kind::NoAdmin(v1::Empty {}),
        Rejection::BuiltInRole => Kind::BuiltInRole(v1::Empty {}),
        Rejection::PermissionNotFound => Kind::PermissionNotFound(v1::Empty {}),
        Rejection::TooManyUsers { max } => Kind::TooManyUsers(v1::Max { max: *max }),
        Rejection::TooManyRoles { max } => Kind::TooManyRoles(v1::Max { max: *max }),
        Rejection::TooManyPermissions { max } => Kind::TooManyPermissions(v1::Max { max: *max }),
        Rejection::AuthBytes { max } => Kind::AuthBytes(v1::Max { max: *max }),
        Rejection::InvalidAuth { reason } => Kind::InvalidAuth(v1::Invalid {
            reason: reason.clone(),
        }),
        _ => return None,
    })
}

/// An auth refusal from the wire; `None` for the other refusals.
pub(super) fn rejection_from_wire(kind: v1::rejection::Kind) -> Option<Rejection> {
    use v1::rejection::Kind;
    Some(match kind {
        Kind::UserExists(n) => Rejection::UserExists { name: n.name },
        Kind::UserNotFound(n) => Rejection::UserNotFound { name: n.name },
        Kind::RoleExists(n) => Rejection::RoleExists { name: n.name },
        Kind::RoleNotFound(n) => Rejection::RoleNotFound { name: n.name },
        Kind::NoAdmin(_) => Rejection::NoAdmin,
        Kind::BuiltInRole(_) => Rejection::BuiltInRole,
        Kind::PermissionNotFound(_) => Rejection::PermissionNotFound,
        Kind::TooManyUsers(max) => Rejection::TooManyUsers { max: max.max },
        Kind::TooManyRoles(max) => Rejection::TooManyRoles { max: max.max },
        Kind::TooManyPermissions(max) => Rejection::TooManyPermissions { max: max.max },
        Kind::AuthBytes(max) => Rejection::AuthBytes { max: max.max },
        Kind::InvalidAuth(why) => Rejection::InvalidAuth { reason: why.reason },
        _ => return None,
    })
}
