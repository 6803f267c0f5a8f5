//! The access-control commands: `user` (users and their passwords), `role`
//! (roles and the key permissions they grant) and `auth` (whether the
//! cluster enforces them). Every change goes through the log exactly once
//! (under an idempotency key); once authentication is enabled, changes and
//! listings need the admin role.

use super::output::Printer;
use super::{EXIT_OK, finish};
use anyhow::{Context as _, bail};
use clap::{Subcommand, ValueEnum};
use oncekv_client::{Client, ClientError, Command, Query, Rejection, Reply};
use oncekv_state::{ADMIN_ROLE, Access, AuthCommand, AuthView, Permission};
use serde_json::{Map, Value, json};
use std::io::BufRead as _;
use std::process::ExitCode;

/// User commands.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add user NAME. Its password is the first line of standard input
    /// unless given with --password (visible to other local users in the
    /// process list) or left out with --no-password (a user who logs in
    /// only with a client certificate whose Common Name is NAME).
    Add {
        name: String,
        #[command(flatten)]
        password: PasswordArgs,
    },
    /// Delete user NAME (its tokens stop working at once; its sessions are
    /// closed and its idempotency keys forgotten).
    Delete { name: String },
    /// Free what user NAME holds of the cluster's quotas: close its
    /// sessions and forget its idempotency keys. The user stays. Its
    /// clients' retries of earlier requests are no longer deduplicated:
    /// on a closed session, a retry of a number sent before (`--seq`) is
    /// told the outcome is unknown (exit 5: the earlier send may have
    /// applied, and no record says), a new request "session expired"
    /// (exit 4); one under a forgotten key is applied again. NAME need
    /// not be a user (records of a deleted one are freed too).
    Purge { name: String },
    /// Change the password of user NAME (its tokens stop working at once).
    Passwd {
        name: String,
        #[command(flatten)]
        password: PasswordArgs,
    },
    /// Give user USER role ROLE (`admin` is built in and allows everything).
    GrantRole { user: String, role: String },
    /// Take role ROLE from user USER.
    RevokeRole { user: String, role: String },
    /// List users and their roles.
    List,
    /// Show user NAME and its roles (exit 3 if there is none).
    Get { name: String },
}

/// How a password is given.
#[derive(Debug, clap::Args)]
pub struct PasswordArgs {
    /// The password (default: the first line of standard input).
    #[arg(long, conflicts_with = "no_password")]
    password: Option<String>,
    /// No password: the user logs in only with a client certificate.
    #[arg(long)]
    no_password: bool,
}

impl PasswordArgs {
    fn read(&self) -> anyhow::Result<Option<String>> {
        if self.no_password {
            return Ok(None);
        }
        if let Some(password) = &self.password {
            return Ok(Some(password.clone()));
        }
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading the password from standard input")?;
        let password = line.trim_end_matches(['\r', '\n']).to_string();
        if password.is_empty() {
            bail!("no password on standard input (give --password, or --no-password)");
        }
        Ok(Some(password))
    }
}

/// What a permission allows.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum AccessArg {
    /// Get and scan.
    Read,
    /// Put, delete, append, and revoking a lease holding the key.
    Write,
    /// Both (INCR and CAS need both).
    Readwrite,
}

impl From<AccessArg> for Access {
    fn from(access: AccessArg) -> Access {
        match access {
            AccessArg::Read => Access::Read,
            AccessArg::Write => Access::Write,
            AccessArg::Readwrite => Access::ReadWrite,
        }
    }
}

/// Role commands.
#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Add role NAME, granting nothing yet.
    Add { name: String },
    /// Delete role NAME (and take it from every user).
    Delete { name: String },
    /// Let ROLE read, write or both KEY, or every key starting with KEY
    /// with --prefix (`--prefix ""` is every key).
    Grant {
        role: String,
        #[arg(value_enum)]
        access: AccessArg,
        key: String,
        #[arg(long)]
        prefix: bool,
    },
    /// Remove ROLE's permission on KEY (or on the prefix KEY, with --prefix).
    Revoke {
        role: String,
        key: String,
        #[arg(long)]
        prefix: bool,
    },
    /// List roles and their permissions.
    List,
    /// Show role NAME and its permissions (exit 3 if there is none).
    Get { name: String },
}

/// Enforcement commands.
#[derive(Debug, Subcommand)]
pub enum AuthSwitch {
    /// Enforce authentication: every call then needs a user (`--user` or a
    /// client certificate), keys need permissions, and membership, status
    /// and auth changes need the admin role. Refused unless a user holds
    /// `admin` (user add root; user grant-role root admin).
    Enable,
    /// Stop enforcing (admin only): every call is allowed again.
    Disable,
    /// Whether authentication is enforced.
    Status,
    /// Revoke a client certificate (admin only): from then on every node
    /// refuses each call over a connection that presented it (exit 13),
    /// whether or not authentication is enforced. Name it by its PEM file
    /// or by --serial, as `openssl x509 -noout -serial` prints it.
    RevokeCert(CertificateArg),
    /// Take a client certificate off the revocation list (admin only).
    UnrevokeCert(CertificateArg),
    /// List the serial numbers of the revoked client certificates.
    RevokedCerts,
}

/// A client certificate, by file or serial number.
#[derive(Debug, clap::Args)]
pub struct CertificateArg {
    /// The certificate's PEM file.
    #[arg(required_unless_present = "serial", conflicts_with = "serial")]
    file: Option<std::path::PathBuf>,
    /// Its serial number in hex (`0A1B2C`, `0a:1b:2c` and `serial=0A1B2C`
    /// all do).
    #[arg(long, value_name = "HEX")]
    serial: Option<String>,
}

impl CertificateArg {
    /// The serial number's bytes, as the cluster files them.
    fn serial(&self) -> anyhow::Result<Vec<u8>> {
        if let Some(file) = &self.file {
            return Ok(oncekv_server::tls::certificate_file_serial(file)?);
        }
        let given = self.serial.as_deref().unwrap_or_default();
        oncekv_server::tls::serial_from_hex(given)
            .ok_or_else(|| anyhow::anyhow!("--serial {given:?} is not a hexadecimal number"))
    }
}

async fn change(client: &Client, printer: &Printer, change: AuthCommand) -> ExitCode {
    finish(
        printer,
        client.execute_once(Command::Auth(change), None).await,
    )
}

async fn view(client: &Client) -> Result<AuthView, ClientError> {
    match client.read(Query::Auth, false).await? {
        Reply::Auth(view) => Ok(view),
        other => Err(ClientError::Invalid(format!(
            "unexpected answer to an auth listing: {other:?}"
        ))),
    }
}

fn permission_text(permission: &Permission) -> String {
    let key = String::from_utf8_lossy(&permission.key);
    let star = if permission.prefix { "*" } else { "" };
    format!("{} {key}{star}", permission.access)
}

/// Runs a `user` command.
pub(super) async fn user(
    client: &Client,
    printer: &Printer,
    command: UserCommand,
) -> anyhow::Result<ExitCode> {
    Ok(match command {
        UserCommand::Add { name, password } => {
            let password_hash = password.read()?;
            let add = AuthCommand::UserAdd {
                name,
                password_hash,
            };
            change(client, printer, add).await
        }
        UserCommand::Delete { name } => {
            change(client, printer, AuthCommand::UserDelete { name }).await
        }
        UserCommand::Purge { name } => {
            change(client, printer, AuthCommand::UserPurge { name }).await
        }
        UserCommand::Passwd { name, password } => {
            let password_hash = password.read()?;
            let passwd = AuthCommand::UserPasswd {
                name,
                password_hash,
            };
            change(client, printer, passwd).await
        }
        UserCommand::GrantRole { user, role } => {
            change(client, printer, AuthCommand::UserGrantRole { user, role }).await
        }
        UserCommand::RevokeRole { user, role } => {
            change(client, printer, AuthCommand::UserRevokeRole { user, role }).await
        }
        UserCommand::List => show_users(client, printer, None).await,
        UserCommand::Get { name } => show_users(client, printer, Some(&name)).await,
    })
}

/// Prints the users (or only `only`, refused when there is none) and
/// their roles.
async fn show_users(client: &Client, printer: &Printer, only: Option<&str>) -> ExitCode {
    let view = match view(client).await {
        Ok(view) => view,
        Err(error) => return printer.error(&error),
    };
    let shown: Vec<_> = view
        .users
        .iter()
        .filter(|u| only.is_none_or(|name| u.name == name))
        .collect();
    if let (Some(name), true) = (only, shown.is_empty()) {
        let missing = Rejection::UserNotFound { name: name.into() };
        return printer.error(&ClientError::Rejected(missing));
    }
    let users: Vec<Value> = shown
        .iter()
        .map(|u| json!({"name": u.name, "roles": u.roles, "password": u.has_password}))
        .collect();
    let lines: Vec<String> = shown
        .iter()
        .map(|u| format!("{} roles={}", u.name, u.roles.join(",")))
        .collect();
    let mut fields = Map::new();
    fields.insert("users".into(), Value::Array(users));
    printer.emit(fields, lines.join("\n"));
    ExitCode::from(EXIT_OK)
}

/// Runs a `role` command.
pub(super) async fn role(client: &Client, printer: &Printer, command: RoleCommand) -> ExitCode {
    match command {
        RoleCommand::Add { name } => change(client, printer, AuthCommand::RoleAdd { name }).await,
        RoleCommand::Delete { name } => {
            change(client, printer, AuthCommand::RoleDelete { name }).await
        }
        RoleCommand::Grant {
            role,
            access,
            key,
            prefix,
        } => {
            let permission = Permission {
                access: access.into(),
                key: key.into_bytes(),
                prefix,
            };
            change(client, printer, AuthCommand::RoleGrant { role, permission }).await
        }
        RoleCommand::Revoke { role, key, prefix } => {
            let key = key.into_bytes();
            change(
                client,
                printer,
                AuthCommand::RoleRevoke { role, key, prefix },
            )
            .await
        }
        RoleCommand::List => show_roles(client, printer, None).await,
        RoleCommand::Get { name } => show_roles(client, printer, Some(&name)).await,
    }
}

/// Prints the roles (or only `only`, refused when there is none) and
/// their permissions.
async fn show_roles(client: &Client, printer: &Printer, only: Option<&str>) -> ExitCode {
    let view = match view(client).await {
        Ok(view) => view,
        Err(error) => return printer.error(&error),
    };
    let shown: Vec<_> = view
        .roles
        .iter()
        .filter(|(name, _)| only.is_none_or(|only| name.as_str() == only))
        .collect();
    if let (Some(name), true) = (only, shown.is_empty()) {
        let missing = Rejection::RoleNotFound { name: name.into() };
        return printer.error(&ClientError::Rejected(missing));
    }
    let roles: Vec<Value> = shown
        .iter()
        .map(|(name, permissions)| {
            let list: Vec<Value> = permissions
                .iter()
                .map(|p| {
                    json!({
                        "access": p.access.name(),
                        "key": String::from_utf8_lossy(&p.key),
                        "prefix": p.prefix,
                    })
                })
                .collect();
            json!({"name": name, "permissions": list})
        })
        .collect();
    let lines: Vec<String> = shown
        .iter()
        .map(|(name, permissions)| {
            if name.as_str() == ADMIN_ROLE {
                return format!("{name}: everything (built in)");
            }
            let list: Vec<String> = permissions.iter().map(permission_text).collect();
            format!("{name}: {}", list.join(", "))
        })
        .collect();
    let mut fields = Map::new();
    fields.insert("roles".into(), Value::Array(roles));
    printer.emit(fields, lines.join("\n"));
    ExitCode::from(EXIT_OK)
}

/// Runs an `auth` command.
pub(super) async fn auth(
    client: &Client,
    printer: &Printer,
    command: AuthSwitch,
) -> anyhow::Result<ExitCode> {
    Ok(match command {
        AuthSwitch::RevokeCert(certificate) => {
            let serial = certificate.serial()?;
            change(client, printer, AuthCommand::CertificateRevoke { serial }).await
        }
        AuthSwitch::UnrevokeCert(certificate) => {
            let serial = certificate.serial()?;
            change(client, printer, AuthCommand::CertificateUnrevoke { serial }).await
        }
        AuthSwitch::RevokedCerts => match view(client).await {
            Ok(view) => {
                let serials: Vec<String> = view
                    .revoked_certificates
                    .iter()
                    .map(|serial| oncekv_state::serial_hex(serial))
                    .collect();
                let mut fields = Map::new();
                fields.insert("revoked_certificates".into(), json!(serials));
                printer.emit(fields, serials.join("\n"));
                ExitCode::from(EXIT_OK)
            }
            Err(error) => printer.error(&error),
        },
        AuthSwitch::Enable => {
            let enable = AuthCommand::Enable {
                token_key: oncekv_state::TokenKey([0; 32]),
            };
            change(client, printer, enable).await
        }
        AuthSwitch::Disable => change(client, printer, AuthCommand::Disable).await,
        AuthSwitch::Status => match view(client).await {
            Ok(view) => {
                let mut fields = Map::new();
                fields.insert("enabled".into(), json!(view.enabled));
                fields.insert("users".into(), json!(view.users.len()));
                let state = if view.enabled { "enabled" } else { "disabled" };
                printer.emit(
                    fields,
                    format!("authentication {state}, {} user(s)", view.users.len()),
                );
                ExitCode::from(EXIT_OK)
            }
            Err(error) => printer.error(&error),
        },
    })
}
