//! `etcdserverpb.Auth` onto the node's own users, roles and key
//! permissions (the replicated `AuthTable`, not a second store): a user
//! added through etcd's API is a native user, a token from `Authenticate`
//! is a native login token (carried in etcd's `token` metadata), and a
//! change is the native auth command, proposed through the log, checked
//! by the state machine (the admin role while authentication is enforced)
//! and deduplicated by the idempotency metadata like other etcd writes
//! (except one carrying a password, whose salted hash differs at each
//! send).
//! Reads (user and role listings, AuthStatus) are served by the leader
//! after a read barrier; a follower forwards every call to the leader.
//!
//! Names: a user is the native user of the same name, so etcd's `root` user
//! is the native user `root`. etcd's `root` role is the native built-in
//! `admin` role, and the other way round (a native role named `root` is
//! etcd's `admin`): `role_name_across`. As on etcd, AuthEnable needs a
//! user `root` holding the root role; while authentication is enforced
//! the root user cannot be deleted nor lose the root role, and the root
//! role is built in: it always exists, adding it does nothing, and it can
//! be neither deleted nor granted or revoked permissions.
//!
//! A permission covers one key (`range_end` empty) or a prefix
//! (`range_end` the prefix's successor; `\0` to `\0`, or the empty key to
//! `\0`, for every key, listed as etcd lists it: `\0` to `\0`), as the
//! native model does; other ranges (`--from-key` of a key, `[a, c)`) are
//! refused as not served.

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered, caller_address};
use super::{EtcdApi, origin_of};
use crate::auth::LoginError;
use crate::login_guard::LoginRefused;
use crate::raft::consensus::WriteError;
use oncekv_proto::etcd::authpb::Permission as EtcdPermission;
use oncekv_proto::etcd::authpb::permission::Type as PermissionType;
use oncekv_proto::etcd::etcdserverpb::auth_client::AuthClient;
use oncekv_proto::etcd::etcdserverpb::auth_server::Auth;
use oncekv_proto::etcd::etcdserverpb::{
    AuthDisableRequest, AuthDisableResponse, AuthEnableRequest, AuthEnableResponse,
    AuthRoleAddRequest, AuthRoleAddResponse, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
    AuthRoleGetRequest, AuthRoleGetResponse, AuthRoleGrantPermissionRequest,
    AuthRoleGrantPermissionResponse, AuthRoleListRequest, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusRequest,
    AuthStatusResponse, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListRequest, AuthUserListResponse, AuthUserRevokeRoleRequest,
    AuthUserRevokeRoleResponse, AuthenticateRequest, AuthenticateResponse, ResponseHeader,
};
use oncekv_state::{
    ADMIN_ROLE, Access, AuthCommand, AuthTable, Command, Origin, Outcome, PASSWORD_HASH_BYTES_MAX,
    Permission, Principal, Rejection, Reply, Request, TokenKey, check_name,
};
use tonic::transport::Channel;
use tonic::{Response, Status};

/// etcd's name of the user AuthEnable needs, and of the role that may do
/// everything.
pub(super) const ROOT: &str = "root";

/// The name in the other API of the role named `name` in one: etcd's
/// `root` is the native `admin`, and a native `root` is etcd's `admin`
/// (the two names trade places), so every role has one name in each API;
/// every other name is the same in both.
pub(super) fn role_name_across(name: &str) -> &str {
    match name {
        ROOT => ADMIN_ROLE,
        ADMIN_ROLE => ROOT,
        other => other,
    }
}

/// `name` if the native model can hold a user or role of that name;
/// `None` means no such user or role can exist.
pub(super) fn holdable(name: &str) -> Option<&str> {
    check_name("user", name).ok().map(|()| name)
}

/// The end of etcd's range of the keys under `prefix` (etcd's
/// `GetPrefixRangeEnd`): the prefix with its last byte below `0xff`
/// incremented and what follows dropped; `\0` (every key from the start
/// on) when there is no such byte.
fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if let Some(next) = last.checked_add(1) {
            end.push(next);
            return end;
        }
    }
    vec![0]
}

/// The native key or prefix etcd's `key` and `range_end` name, as etcd
/// reads them: one key (`range_end` empty), a prefix (`range_end` its
/// successor), or every key (`\0` to `\0`, or the empty key to `\0`).
pub(super) fn key_or_prefix(key: &[u8], range_end: &[u8]) -> Result<(Vec<u8>, bool), EtcdError> {
    if range_end.is_empty() {
        if key.is_empty() {
            return Err(EtcdError::EmptyKey);
        }
        return Ok((key.to_vec(), false));
    }
    if key == [0] && range_end == [0] {
        return Ok((Vec::new(), true));
    }
    if prefix_range_end(key) == range_end {
        return Ok((key.to_vec(), true));
    }
    let what = if range_end == [0] {
        "a permission on every key from a key on (--from-key)"
    } else {
        "a permission on a range other than one key or a prefix"
    };
    Err(EtcdError::Unsupported(what.to_string()))
}

/// The native permission of etcd's `permission`.
pub(super) fn permission_from_wire(permission: &EtcdPermission) -> Result<Permission, EtcdError> {
    let access = match PermissionType::try_from(permission.perm_type) {
        Ok(PermissionType::Read) => Access::Read,
        Ok(PermissionType::Write) => Access::Write,
        Ok(PermissionType::Readwrite) => Access::ReadWrite,
        Err(_) => {
            return Err(EtcdError::Invalid(format!(
                "permission type {} is none of READ, WRITE and READWRITE",
                permission.perm_type
            )));
        }
    };
    let (key, prefix) = key_or_prefix(&permission.key, &permission.range_end)?;
    Ok(Permission {
        access,
        key,
        prefix,
    })
}

/// etcd's form of the native `permission` (every key, the empty prefix,
/// as etcd stores it: `\0` to `\0`).
fn permission_to_wire(permission: &Permission) -> EtcdPermission {
    let perm_type = match permission.access {
        Access::Read => PermissionType::Read,
        Access::Write => PermissionType::Write,
        Access::ReadWrite => PermissionType::Readwrite,
    };
    let (key, range_end) = match (permission.prefix, permission.key.is_empty()) {
        (true, true) => (vec![0], vec![0]),
        (true, false) => (permission.key.clone(), prefix_range_end(&permission.key)),
        (false, _) => (permission.key.clone(), Vec::new()),
    };
    EtcdPermission {
        perm_type: perm_type as i32,
        key,
        range_end,
    }
}

/// A role's permissions as etcd lists them: by key, then range end.
fn permissions_to_wire(permissions: &[Permission]) -> Vec<EtcdPermission> {
    let mut listed: Vec<EtcdPermission> = permissions.iter().map(permission_to_wire).collect();
    listed.sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
    listed
}

/// Refuses a password the node would not store: etcd takes an empty one,
/// oncekv a user without a password (`no_password`) instead.
pub(super) fn check_password(password: &str) -> Result<(), EtcdError> {
    if password.is_empty() {
        return Err(EtcdError::Invalid(
            "a password may not be empty (add the user with no_password for one that logs in \
             only with a client certificate)"
                .to_string(),
        ));
    }
    if password.len() > PASSWORD_HASH_BYTES_MAX {
        return Err(EtcdError::Invalid(format!(
            "a password is at most {PASSWORD_HASH_BYTES_MAX} bytes, got {}",
            password.len()
        )));
    }
    Ok(())
}

/// The permissions of the role named `name` (native), if it exists.
pub(super) fn role_permissions(auth: &AuthTable, name: &str) -> Option<Vec<Permission>> {
    auth.role_permissions(name).map(<[Permission]>::to_vec)
}

impl EtcdApi {
    /// An Auth client of the leader, over `channel`.
    fn leader_auth(&self, channel: Channel) -> AuthClient<Channel> {
        AuthClient::new(channel)
            .max_decoding_message_size(self.message_bytes_max)
            .max_encoding_message_size(self.message_bytes_max)
    }

    /// `read` on this replica's users and roles.
    fn with_auth<R>(&self, read: impl FnOnce(&AuthTable) -> R) -> R {
        self.node.consensus().with_state(|state| read(state.auth()))
    }

    /// A header at this replica's last applied index.
    fn applied_header(&self) -> ResponseHeader {
        let applied = self
            .node
            .consensus()
            .with_state(|state| state.last_applied().map_or(0, |index| index.0));
        self.header(applied)
    }

    /// Refuses `request` unless its caller may manage authentication
    /// (anyone may while it is not enforced). Checked before etcd's own
    /// checks of a change, as etcd checks it; the state machine checks it
    /// again where the change applies.
    fn check_manager<T>(&self, request: &tonic::Request<T>) -> Result<(), Status> {
        let principal = self.principal(request, true)?;
        self.with_auth(|auth| admin_only(auth, principal.as_ref()))
            .map_err(Status::from)
    }

    /// Proposes `change` from `request`'s caller and answers the header
    /// of the entry it applied at; a refusal of the state machine is
    /// answered as `refused` says. A change carrying a password is never
    /// deduplicated: its hash is salted afresh on each send, so a resend
    /// could not be told from another request (and a resend of a user's
    /// creation is then refused as etcd refuses it).
    async fn change_auth<T>(
        &self,
        request: &tonic::Request<T>,
        change: AuthCommand,
        refused: impl FnOnce(&Rejection) -> EtcdError,
    ) -> Result<ResponseHeader, Status> {
        let carries_password = matches!(
            &change,
            AuthCommand::UserAdd {
                password_hash: Some(_),
                ..
            } | AuthCommand::UserPasswd {
                password_hash: Some(_),
                ..
            }
        );
        let origin = if carries_password {
            Origin::Plain
        } else {
            origin_of(request)?
        };
        let principal = self.principal(request, true)?;
        let command = Command::Auth(change);
        let executed = self
            .node
            .execute(Request { origin, command }, principal)
            .await
            .map_err(|error| Status::from(error_of(error)))?;
        let (reply, revision) = match executed.outcome {
            Outcome::Applied(reply) => (reply, executed.index.0),
            Outcome::Replayed {
                reply,
                applied_index,
            } => (reply, applied_index.0),
            other => return Err(EtcdError::of_outcome(&other).into()),
        };
        match reply {
            Reply::AuthChanged => Ok(self.header(revision)),
            Reply::Rejected(rejection) => Err(refused(&rejection).into()),
            other => Err(EtcdError::Invalid(format!("unexpected reply {other:?}")).into()),
        }
    }

    /// `read` on the users and roles as the leader has them (after a read
    /// barrier), given `request`'s caller; answers what it read and the
    /// header of the index read at.
    async fn read_auth<T, R>(
        &self,
        request: &tonic::Request<T>,
        read: impl FnOnce(&AuthTable, Option<&Principal>) -> Result<R, EtcdError>,
    ) -> Result<(R, ResponseHeader), Status> {
        let principal = self.principal(request, true)?;
        self.node
            .consensus()
            .read_barrier()
            .await
            .map_err(|error| Status::from(error_of(error)))?;
        let (read, applied) = self.node.consensus().with_state(|state| {
            let read = read(state.auth(), principal.as_ref());
            (read, state.last_applied().map_or(0, |index| index.0))
        });
        Ok((read?, self.header(applied)))
    }
}

/// Refuses a caller who is not an admin (anyone is while authentication
/// is not enforced).
fn admin_only(auth: &AuthTable, principal: Option<&Principal>) -> Result<(), EtcdError> {
    if auth.is_admin(principal) {
        Ok(())
    } else {
        Err(EtcdError::PermissionDenied)
    }
}

#[tonic::async_trait]
impl Auth for EtcdApi {
    async fn auth_enable(
        &self,
        request: tonic::Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).auth_enable(request).await);
        }
        self.check_manager(&request)?;
        let (enabled, root_is_admin) = self.with_auth(|auth| {
            let root = auth.user(ROOT).map(|user| user.roles.contains(ADMIN_ROLE));
            (auth.is_enabled(), root)
        });
        // Enforced already: nothing to do (enabling again would draw a new
        // token key, voiding every token).
        if enabled {
            return Ok(Response::new(AuthEnableResponse {
                header: Some(self.applied_header()),
            }));
        }
        match root_is_admin {
            None => return Err(EtcdError::RootUserNotExist.into()),
            Some(false) => return Err(EtcdError::RootRoleNotExist.into()),
            Some(true) => {}
        }
        // The leader draws the token key into the entry.
        let enable = AuthCommand::Enable {
            token_key: TokenKey([0; 32]),
        };
        let header = self
            .change_auth(&request, enable, |rejection| match rejection {
                Rejection::NoAdmin => EtcdError::RootRoleNotExist,
                other => EtcdError::of_rejection(other),
            })
            .await?;
        Ok(Response::new(AuthEnableResponse {
            header: Some(header),
        }))
    }

    async fn auth_disable(
        &self,
        request: tonic::Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).auth_disable(request).await);
        }
        self.check_manager(&request)?;
        let header = self
            .change_auth(&request, AuthCommand::Disable, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthDisableResponse {
            header: Some(header),
        }))
    }

    async fn auth_status(
        &self,
        request: tonic::Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).auth_status(request).await);
        }
        let (enabled, header) = self
            .read_auth(&request, |auth, principal| {
                admin_only(auth, principal)?;
                Ok(auth.is_enabled())
            })
            .await?;
        // The node keeps no revision of its own for users and roles: the
        // index read at grows with every change to them (and others).
        let auth_revision = u64::try_from(header.revision).unwrap_or(0);
        Ok(Response::new(AuthStatusResponse {
            header: Some(header),
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: tonic::Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let source = caller_address(&request);
        if let Route::Leader(channel) = self.route(&request).await? {
            // Limited here as well, for the caller's own address (the
            // leader sees this node's), before anything is forwarded.
            let attempt = crate::login_guard::guard()
                .begin_attempt(&request.get_ref().name, source)
                .map_err(|refused| login_refused(&refused))?;
            let request = self.forwarded(request);
            let answer = answered(self.leader_auth(channel).authenticate(request).await);
            let failed = Status::from(EtcdError::AuthFailed);
            if answer
                .as_ref()
                .is_err_and(|status| status.message() == failed.message())
            {
                attempt.failed();
            }
            return answer;
        }
        let asked = request.get_ref();
        let ttl = self.node.token_ttl();
        match self
            .node
            .login(&asked.name, &asked.password, ttl, source)
            .await
        {
            Ok((token, _expires)) => Ok(Response::new(AuthenticateResponse {
                header: Some(self.applied_header()),
                token,
            })),
            Err(LoginError::Refused(refused)) => Err(login_refused(&refused)),
            Err(LoginError::Failed(WriteError::Unauthenticated(_))) => {
                if self.with_auth(AuthTable::is_enabled) {
                    Err(EtcdError::AuthFailed.into())
                } else {
                    Err(EtcdError::AuthNotEnabled.into())
                }
            }
            Err(LoginError::Failed(other)) => Err(error_of(other).into()),
        }
    }

    async fn user_add(
        &self,
        request: tonic::Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).user_add(request).await);
        }
        self.check_manager(&request)?;
        let asked = request.get_ref();
        if asked.name.is_empty() {
            return Err(EtcdError::UserEmpty.into());
        }
        // etcd's `hashedPassword` is filled in by etcd's own API layer;
        // what a client sends there is ignored, as etcd ignores it.
        let no_password = asked.options.is_some_and(|options| options.no_password);
        let password_hash = if no_password {
            None
        } else {
            check_password(&asked.password)?;
            Some(asked.password.clone())
        };
        let add = AuthCommand::UserAdd {
            name: asked.name.clone(),
            password_hash,
        };
        let header = self
            .change_auth(&request, add, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthUserAddResponse {
            header: Some(header),
        }))
    }

    async fn user_get(
        &self,
        request: tonic::Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).user_get(request).await);
        }
        let name = request.get_ref().name.clone();
        let (roles, header) = self
            .read_auth(&request, |auth, principal| {
                // A user may see itself, as on etcd.
                if principal.is_none_or(|caller| caller.0 != name) {
                    admin_only(auth, principal)?;
                }
                let user = holdable(&name)
                    .and_then(|name| auth.user(name))
                    .ok_or(EtcdError::UserNotFound)?;
                let mut roles: Vec<String> = user
                    .roles
                    .iter()
                    .map(|role| role_name_across(role).to_string())
                    .collect();
                roles.sort();
                Ok(roles)
            })
            .await?;
        Ok(Response::new(AuthUserGetResponse {
            header: Some(header),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: tonic::Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).user_list(request).await);
        }
        let (users, header) = self
            .read_auth(&request, |auth, principal| {
                admin_only(auth, principal)?;
                // By name, as the table keeps them.
                Ok(auth.user_names().map(str::to_string).collect())
            })
            .await?;
        Ok(Response::new(AuthUserListResponse {
            header: Some(header),
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: tonic::Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).user_delete(request).await);
        }
        self.check_manager(&request)?;
        let name = &request.get_ref().name;
        if name == ROOT && self.with_auth(AuthTable::is_enabled) {
            return Err(EtcdError::InvalidAuthMgmt.into());
        }
        let name = holdable(name).ok_or(EtcdError::UserNotFound)?.to_string();
        let delete = AuthCommand::UserDelete { name };
        let header = self
            .change_auth(&request, delete, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthUserDeleteResponse {
            header: Some(header),
        }))
    }

    async fn user_change_password(
        &self,
        request: tonic::Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(
                self.leader_auth(channel)
                    .user_change_password(request)
                    .await,
            );
        }
        self.check_manager(&request)?;
        let asked = request.get_ref();
        let name = holdable(&asked.name)
            .ok_or(EtcdError::UserNotFound)?
            .to_string();
        check_password(&asked.password)?;
        let change = AuthCommand::UserPasswd {
            name,
            password_hash: Some(asked.password.clone()),
        };
        let header = self
            .change_auth(&request, change, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthUserChangePasswordResponse {
            header: Some(header),
        }))
    }

    async fn user_grant_role(
        &self,
        request: tonic::Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).user_grant_role(request).await);
        }
        self.check_manager(&request)?;
        let asked = request.get_ref();
        // etcd looks for the user first, then the role.
        let user = holdable(&asked.user)
            .filter(|user| self.with_auth(|auth| auth.user(user).is_some()))
            .ok_or(EtcdError::UserNotFound)?
            .to_string();
        let role = holdable(role_name_across(&asked.role))
            .ok_or(EtcdError::RoleNotFound)?
            .to_string();
        let grant = AuthCommand::UserGrantRole { user, role };
        let header = self
            .change_auth(&request, grant, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthUserGrantRoleResponse {
            header: Some(header),
        }))
    }

    async fn user_revoke_role(
        &self,
        request: tonic::Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).user_revoke_role(request).await);
        }
        self.check_manager(&request)?;
        let asked = request.get_ref();
        if asked.name == ROOT && asked.role == ROOT && self.with_auth(AuthTable::is_enabled) {
            return Err(EtcdError::InvalidAuthMgmt.into());
        }
        let user = holdable(&asked.name)
            .ok_or(EtcdError::UserNotFound)?
            .to_string();
        let role = holdable(role_name_across(&asked.role))
            .ok_or(EtcdError::RoleNotGranted)?
            .to_string();
        let revoke = AuthCommand::UserRevokeRole { user, role };
        let header = self
            .change_auth(&request, revoke, |rejection| match rejection {
                // The native refusal of a role the user does not hold.
                Rejection::RoleNotFound { .. } => EtcdError::RoleNotGranted,
                other => EtcdError::of_rejection(other),
            })
            .await?;
        Ok(Response::new(AuthUserRevokeRoleResponse {
            header: Some(header),
        }))
    }

    async fn role_add(
        &self,
        request: tonic::Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).role_add(request).await);
        }
        self.check_manager(&request)?;
        let name = &request.get_ref().name;
        if name.is_empty() {
            return Err(EtcdError::RoleEmpty.into());
        }
        // The root role is built in (etcdctl's `auth enable` adds it when
        // root lacks it, then grants it).
        if name == ROOT {
            return Ok(Response::new(AuthRoleAddResponse {
                header: Some(self.applied_header()),
            }));
        }
        let add = AuthCommand::RoleAdd {
            name: role_name_across(name).to_string(),
        };
        let header = self
            .change_auth(&request, add, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthRoleAddResponse {
            header: Some(header),
        }))
    }

    async fn role_get(
        &self,
        request: tonic::Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).role_get(request).await);
        }
        let role = role_name_across(&request.get_ref().role).to_string();
        let (perm, header) = self
            .read_auth(&request, |auth, principal| {
                // A user may see the roles it holds, as on etcd.
                let holds = principal
                    .and_then(|caller| auth.user(&caller.0))
                    .is_some_and(|user| user.roles.contains(&role));
                if !holds {
                    admin_only(auth, principal)?;
                }
                // etcd lists no permission for the root role.
                if role == ADMIN_ROLE {
                    return Ok(Vec::new());
                }
                let permissions = holdable(&role)
                    .and_then(|role| role_permissions(auth, role))
                    .ok_or(EtcdError::RoleNotFound)?;
                Ok(permissions_to_wire(&permissions))
            })
            .await?;
        Ok(Response::new(AuthRoleGetResponse {
            header: Some(header),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: tonic::Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).role_list(request).await);
        }
        let (roles, header) = self
            .read_auth(&request, |auth, principal| {
                admin_only(auth, principal)?;
                let mut roles: Vec<String> = auth
                    .role_names()
                    .map(|role| role_name_across(role).to_string())
                    .collect();
                roles.sort();
                Ok(roles)
            })
            .await?;
        Ok(Response::new(AuthRoleListResponse {
            header: Some(header),
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: tonic::Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_auth(channel).role_delete(request).await);
        }
        self.check_manager(&request)?;
        let name = &request.get_ref().role;
        // The root role is built in (etcd refuses only while
        // authentication is enforced).
        if name == ROOT {
            return Err(EtcdError::InvalidAuthMgmt.into());
        }
        let name = holdable(role_name_across(name))
            .ok_or(EtcdError::RoleNotFound)?
            .to_string();
        let delete = AuthCommand::RoleDelete { name };
        let header = self
            .change_auth(&request, delete, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthRoleDeleteResponse {
            header: Some(header),
        }))
    }

    async fn role_grant_permission(
        &self,
        request: tonic::Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(
                self.leader_auth(channel)
                    .role_grant_permission(request)
                    .await,
            );
        }
        self.check_manager(&request)?;
        let asked = request.get_ref();
        let permission = asked.perm.as_ref().ok_or(EtcdError::PermissionNotGiven)?;
        let role = holdable(role_name_across(&asked.name))
            .ok_or(EtcdError::RoleNotFound)?
            .to_string();
        let permission = permission_from_wire(permission)?;
        let grant = AuthCommand::RoleGrant { role, permission };
        let header = self
            .change_auth(&request, grant, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse {
            header: Some(header),
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: tonic::Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(
                self.leader_auth(channel)
                    .role_revoke_permission(request)
                    .await,
            );
        }
        self.check_manager(&request)?;
        let asked = request.get_ref();
        let role = holdable(role_name_across(&asked.role))
            .filter(|role| self.with_auth(|auth| auth.role_permissions(role).is_some()))
            .ok_or(EtcdError::RoleNotFound)?
            .to_string();
        // The root role grants nothing by name, and a range the native
        // model cannot hold was never granted.
        if role == ADMIN_ROLE {
            return Err(EtcdError::PermissionNotGranted.into());
        }
        let (key, prefix) = key_or_prefix(&asked.key, &asked.range_end)
            .map_err(|_| EtcdError::PermissionNotGranted)?;
        let revoke = AuthCommand::RoleRevoke { role, key, prefix };
        let header = self
            .change_auth(&request, revoke, EtcdError::of_rejection)
            .await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse {
            header: Some(header),
        }))
    }
}

/// A login refused before its password was checked, as the etcd API
/// answers it: too many failed logins is RESOURCE_EXHAUSTED,
/// "etcdserver: too many failed logins ..., retry after N s" (etcd has no
/// such limit, so no text of its own; its clients show the message); too
/// many logins waiting is the table's "too many requests" (load shed).
fn login_refused(refused: &LoginRefused) -> Status {
    match refused {
        LoginRefused::User { .. } | LoginRefused::Source { .. } => {
            Status::resource_exhausted(format!("etcdserver: {refused}"))
        }
        LoginRefused::Busy => error_of(WriteError::Overloaded("logins")).into(),
        LoginRefused::Stopping => error_of(WriteError::NotLeader {
            leader_id: None,
            leader: None,
        })
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_admin_trade_names_and_other_roles_keep_theirs() {
        assert_eq!(role_name_across("root"), "admin");
        assert_eq!(role_name_across("admin"), "root");
        assert_eq!(role_name_across("app"), "app");
        for name in ["root", "admin", "app"] {
            assert_eq!(role_name_across(role_name_across(name)), name);
        }
    }

    #[test]
    fn a_key_and_a_prefix_cross_the_wire_both_ways() {
        let wire = |perm_type: PermissionType, key: &[u8], range_end: &[u8]| EtcdPermission {
            perm_type: perm_type as i32,
            key: key.to_vec(),
            range_end: range_end.to_vec(),
        };
        let cases = [
            (
                wire(PermissionType::Read, b"k", b""),
                Access::Read,
                &b"k"[..],
                false,
            ),
            (
                wire(PermissionType::Write, b"p/", b"p0"),
                Access::Write,
                b"p/",
                true,
            ),
            (
                wire(PermissionType::Readwrite, b"\0", b"\0"),
                Access::ReadWrite,
                b"",
                true,
            ),
            (
                wire(PermissionType::Read, b"a\xff", b"b"),
                Access::Read,
                b"a\xff",
                true,
            ),
        ];
        for (etcd, access, key, prefix) in cases {
            let native = permission_from_wire(&etcd).unwrap();
            assert_eq!(
                native,
                Permission {
                    access,
                    key: key.to_vec(),
                    prefix
                }
            );
            assert_eq!(permission_to_wire(&native), etcd);
        }
        // Every key, as etcdctl's `--prefix` of the empty key sends it.
        let every = permission_from_wire(&wire(PermissionType::Read, b"", b"\0")).unwrap();
        assert_eq!((every.key.as_slice(), every.prefix), (&b""[..], true));
    }

    #[test]
    fn ranges_the_native_model_cannot_hold_are_refused_as_not_served() {
        let from_key = EtcdPermission {
            perm_type: PermissionType::Read as i32,
            key: b"f".to_vec(),
            range_end: vec![0],
        };
        let refused = permission_from_wire(&from_key).unwrap_err();
        let status = Status::from(refused);
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(
            status
                .message()
                .contains("every key from a key on (--from-key)"),
            "{status:?}"
        );
        let range = EtcdPermission {
            range_end: b"c".to_vec(),
            key: b"a".to_vec(),
            ..from_key.clone()
        };
        assert!(matches!(
            permission_from_wire(&range),
            Err(EtcdError::Unsupported(_))
        ));
        let unknown_type = EtcdPermission {
            perm_type: 7,
            ..from_key
        };
        assert!(matches!(
            permission_from_wire(&unknown_type),
            Err(EtcdError::Invalid(_))
        ));
    }

    #[test]
    fn permissions_are_listed_by_key_then_range_end() {
        let permission = |key: &[u8], prefix| Permission {
            access: Access::Read,
            key: key.to_vec(),
            prefix,
        };
        let listed = permissions_to_wire(&[
            permission(b"b", false),
            permission(b"a", true),
            permission(b"a", false),
        ]);
        let keys: Vec<(&[u8], &[u8])> = listed
            .iter()
            .map(|p| (p.key.as_slice(), p.range_end.as_slice()))
            .collect();
        assert_eq!(keys, vec![(&b"a"[..], &b""[..]), (b"a", b"b"), (b"b", b"")]);
    }

    #[test]
    fn passwords_and_names_the_node_cannot_store_are_caught_early() {
        assert!(check_password("").is_err());
        assert!(check_password(&"x".repeat(PASSWORD_HASH_BYTES_MAX + 1)).is_err());
        assert!(check_password("secret").is_ok());
        assert_eq!(holdable("alice"), Some("alice"));
        assert_eq!(holdable("a b"), None);
        assert_eq!(holdable(""), None);
        assert_eq!(prefix_range_end(b"\xff"), vec![0]);
        assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
    }
}
