//! Certificates for a TLS cluster, made with `rcgen` (pure Rust, `ring`):
//! the one implementation behind `oncekv certs`, the harness's TLS
//! clusters (`oncekv_harness::certs` is this module) and the tests. Part
//! of the product, since operators make their cluster's certificates with
//! it; the node itself only reads them (`tls`).
//!
//! - a CA ([`create_ca`]): `ca.pem`, `ca-key.pem`;
//! - a node ([`create_node`]): `node-<id>.pem`, `node-<id>-key.pem`, with
//!   the DNS name `node-<id>` (what peers verify) and the hosts it serves
//!   on as further names, usable as server and as client (peers dial each
//!   other);
//! - a client ([`create_client`]): `client-<name>.pem`,
//!   `client-<name>-key.pem`, Common Name `<name>`, client use only;
//! - a peer token ([`create_token`]): a shared cluster secret of 32 random
//!   bytes in hex, for `oncekv serve --peer-token-file` (not a
//!   certificate, but made and kept the same way).
//!
//! Key files and tokens are created `0600`. Nothing is overwritten (but a
//! token with `force`): a file that exists is an error, and so the files
//! of one call are all new.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How long a CA certificate is valid by default, in days (10 years).
pub const CA_DAYS_DEFAULT: u32 = 3650;
/// How long a node or client certificate is valid by default, in days.
pub const LEAF_DAYS_DEFAULT: u32 = 825;

/// The hosts a node certificate names when none are given.
pub const NODE_HOSTS_DEFAULT: [&str; 2] = ["127.0.0.1", "localhost"];

/// Why certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file to be written exists already.
    #[error("{0} exists already: refusing to overwrite it (remove it first, or use another --dir)")]
    Exists(PathBuf),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The CA files in the directory are missing or unusable.
    #[error("the CA in {dir} is unusable ({reason}); `oncekv certs create-ca --dir {dir}` makes one", dir = .dir.display())]
    Ca {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A name that cannot go in a certificate or a file name.
    #[error("bad name {0:?}: use letters, digits, '.', '-' and '_'")]
    BadName(String),
    /// rcgen refused the certificate.
    #[error("making the certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// The files of one certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, mode 0600).
    pub key: PathBuf,
}

/// The CA's files in `dir`.
pub fn ca_files(dir: &Path) -> CertFiles {
    CertFiles {
        cert: dir.join("ca.pem"),
        key: dir.join("ca-key.pem"),
    }
}

/// Node `id`'s files in `dir`.
pub fn node_files(dir: &Path, id: u64) -> CertFiles {
    CertFiles {
        cert: dir.join(format!("node-{id}.pem")),
        key: dir.join(format!("node-{id}-key.pem")),
    }
}

/// Client `user`'s files in `dir`.
pub fn client_files(dir: &Path, user: &str) -> CertFiles {
    CertFiles {
        cert: dir.join(format!("client-{user}.pem")),
        key: dir.join(format!("client-{user}-key.pem")),
    }
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // An hour back, for clocks a little behind.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Refuses to go on if any of `files` exists.
fn none_exist(files: &CertFiles) -> Result<(), CertError> {
    for path in [&files.cert, &files.key] {
        if path.exists() {
            return Err(CertError::Exists(path.clone()));
        }
    }
    Ok(())
}

/// Writes `text` to a new file (never over one), with `mode`.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), CertError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                CertError::Exists(path.to_path_buf())
            } else {
                CertError::Io {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
    file.write_all(text.as_bytes()).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

fn write_pair(files: &CertFiles, cert: &str, key: &KeyPair) -> Result<(), CertError> {
    none_exist(files)?;
    if let Some(dir) = files.cert.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    write_new(&files.key, &key.serialize_pem(), 0o600)?;
    write_new(&files.cert, cert, 0o644)
}

fn check_name(name: &str) -> Result<(), CertError> {
    let fine = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if fine {
        Ok(())
    } else {
        Err(CertError::BadName(name.to_string()))
    }
}

/// Makes a CA in `dir` (`ca.pem`, `ca-key.pem`), valid for `days`.
pub fn create_ca(dir: &Path, days: u32) -> Result<CertFiles, CertError> {
    let files = ca_files(dir);
    none_exist(&files)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    // Named after its key, so two CAs are told apart (by people, and by
    // TLS: a certificate of another CA is then of an unknown issuer).
    let tag: String = key
        .public_key_raw()
        .iter()
        .rev()
        .take(4)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    name.push(DnType::CommonName, format!("oncekv CA {tag}"));
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days);
    let cert = params.self_signed(&key)?;
    write_pair(&files, &cert.pem(), &key)?;
    Ok(files)
}

/// The CA of `dir`, to sign with.
fn load_ca(dir: &Path) -> Result<Issuer<'static, KeyPair>, CertError> {
    let files = ca_files(dir);
    let unusable = |reason: String| CertError::Ca {
        dir: dir.to_path_buf(),
        reason,
    };
    let cert = std::fs::read_to_string(&files.cert)
        .map_err(|error| unusable(format!("{}: {error}", files.cert.display())))?;
    let key = std::fs::read_to_string(&files.key)
        .map_err(|error| unusable(format!("{}: {error}", files.key.display())))?;
    let key = KeyPair::from_pem(&key)
        .map_err(|error| unusable(format!("{}: {error}", files.key.display())))?;
    Issuer::from_ca_cert_pem(&cert, key)
        .map_err(|error| unusable(format!("{}: {error}", files.cert.display())))
}

/// Makes node `id`'s certificate in `dir`, signed by the CA there: DNS
/// name `node-<id>` and `hosts` (IP addresses or DNS names; none given:
/// [`NODE_HOSTS_DEFAULT`]), for server and client use, valid for `days`.
pub fn create_node(
    dir: &Path,
    id: u64,
    hosts: &[String],
    days: u32,
) -> Result<CertFiles, CertError> {
    let files = node_files(dir, id);
    none_exist(&files)?;
    let issuer = load_ca(dir)?;
    let node = format!("node-{id}");
    let mut names = vec![node.clone()];
    if hosts.is_empty() {
        names.extend(NODE_HOSTS_DEFAULT.iter().map(|host| host.to_string()));
    } else {
        names.extend(hosts.iter().cloned());
    }
    names.dedup();
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name.push(DnType::CommonName, node);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    validity(&mut params, days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    write_pair(&files, &cert.pem(), &key)?;
    Ok(files)
}

/// Makes client `user`'s certificate in `dir`, signed by the CA there:
/// Common Name `user`, client use only, valid for `days`.
pub fn create_client(dir: &Path, user: &str, days: u32) -> Result<CertFiles, CertError> {
    check_name(user)?;
    let files = client_files(dir, user);
    none_exist(&files)?;
    let issuer = load_ca(dir)?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, user);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params, days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    write_pair(&files, &cert.pem(), &key)?;
    Ok(files)
}

/// A CA and node certificates `1..=nodes` (default hosts) in `dir`: what a
/// test cluster on loopback needs.
pub fn create_cluster(dir: &Path, nodes: u64) -> Result<(), CertError> {
    create_ca(dir, CA_DAYS_DEFAULT)?;
    for id in 1..=nodes {
        create_node(dir, id, &[], LEAF_DAYS_DEFAULT)?;
    }
    Ok(())
}

/// Random bytes in a peer token ([`create_token`]), written as twice as
/// many hex digits.
pub const TOKEN_RANDOM_BYTES: usize = 32;

/// Makes a peer token (`oncekv serve --peer-token-file`): writes
/// [`TOKEN_RANDOM_BYTES`] random bytes, hex-encoded, and a newline to
/// `path`, mode `0600`. An existing file is an error ([`CertError::Exists`])
/// unless `force`, and then it is replaced, mode `0600` too.
pub fn create_token(path: &Path, force: bool) -> Result<(), CertError> {
    let secret: [u8; TOKEN_RANDOM_BYTES] = rand10::random();
    let text: String = secret
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .chain(["\n".to_string()])
        .collect();
    if !force {
        return write_new(path, &text, 0o600);
    }
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    // An existing file keeps its mode when opened: make it private
    // before the secret is in it.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io(path))?;
    file.write_all(text.as_bytes()).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_token_is_64_private_hex_digits_and_replaced_only_when_forced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("peer-token");
        create_token(&path, false).expect("a token");
        let mode =
            |path: &Path| std::fs::metadata(path).expect("token").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        let first = std::fs::read_to_string(&path).expect("token");
        assert_eq!(first.len(), 65, "{first:?}");
        assert!(first.ends_with('\n'));
        assert!(first.trim().bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(matches!(
            create_token(&path, false),
            Err(CertError::Exists(_))
        ));
        assert_eq!(std::fs::read_to_string(&path).expect("token"), first);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        create_token(&path, true).expect("forced");
        assert_eq!(mode(&path), 0o600);
        let second = std::fs::read_to_string(&path).expect("token");
        assert_eq!(second.len(), 65);
        assert_ne!(first, second);
    }

    #[test]
    fn a_ca_signs_nodes_and_clients_and_nothing_is_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = create_ca(dir.path(), CA_DAYS_DEFAULT).expect("ca");
        let node = create_node(dir.path(), 3, &[], LEAF_DAYS_DEFAULT).expect("node");
        let client = create_client(dir.path(), "alice", LEAF_DAYS_DEFAULT).expect("client");
        for files in [&ca, &node, &client] {
            let mode = std::fs::metadata(&files.key)
                .expect("key")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{}", files.key.display());
            let pem = std::fs::read_to_string(&files.cert).expect("cert");
            assert!(pem.contains("BEGIN CERTIFICATE"));
        }
        assert!(matches!(
            create_ca(dir.path(), CA_DAYS_DEFAULT),
            Err(CertError::Exists(_))
        ));
        assert!(matches!(
            create_node(dir.path(), 3, &[], LEAF_DAYS_DEFAULT),
            Err(CertError::Exists(_))
        ));
        assert!(matches!(
            create_client(dir.path(), "../x", LEAF_DAYS_DEFAULT),
            Err(CertError::BadName(_))
        ));
        let other = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            create_node(other.path(), 1, &[], LEAF_DAYS_DEFAULT),
            Err(CertError::Ca { .. })
        ));
    }
}
