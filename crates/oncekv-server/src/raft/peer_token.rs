//! [`PeerToken`]: the shared cluster secret that authenticates peers
//! without TLS (`oncekv serve --peer-token-file FILE`, the same file on
//! every node; `oncekv certs create-token` makes one).
//!
//! Every call of the peer service (`RaftPeer`: votes and pre-votes,
//! appends unary and streamed, snapshots, leadership transfers) carries
//! the gRPC metadata [`PEER_TOKEN_METADATA`], set by the sending side
//! ([`super::network`]). Its value is not the secret itself but a
//! credential derived from it: the hex HMAC-SHA256, keyed by the secret,
//! of a fixed label ([`PeerToken::credential`]), so it is plain ASCII
//! whatever bytes the file holds. The receiving side checks it in
//! [`PeerTokenCheck`], an interceptor that sees the call's headers before
//! any message of its body is read or decoded, comparing in constant time
//! (the HMAC's own verification); a call without it, or with another, is
//! answered UNAUTHENTICATED with what to fix, logged and counted
//! (`oncekv_peer_messages_refused_total`), and never reaches the peer
//! service (nor openraft, nor the snapshot spool).
//!
//! The credential is a bearer secret: whoever reads it on the wire can
//! send with it. On a network others can watch, use it with peer TLS
//! (`--peer-cert-file`...), which hides it, or use peer TLS alone.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::{Path, PathBuf};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Request, Status};

/// The gRPC metadata key every peer call carries the credential in (the
/// wire contract's).
pub use oncekv_proto::PEER_TOKEN_METADATA;

/// The fewest bytes a peer token may have (after trimming): what
/// `oncekv certs create-token` writes is 64 hex digits of 32 random bytes.
pub const PEER_TOKEN_BYTES_MIN: usize = 32;

/// What the credential is an HMAC of (a version, should it ever change).
const CREDENTIAL_LABEL: &[u8] = b"oncekv peer token v1";

type HmacSha256 = Hmac<Sha256>;

/// Why a peer token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PeerTokenError {
    /// The file could not be read.
    #[error("cannot read the peer token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file holds nothing but white space.
    #[error(
        "the peer token file {path} is empty: put a shared secret in it (`oncekv certs create-token --out FILE` makes one)"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The token is too short to be a secret.
    #[error(
        "the peer token in {path} is {bytes} bytes long: at least {PEER_TOKEN_BYTES_MIN} are needed (`oncekv certs create-token --out FILE` makes one of 64 hex digits)"
    )]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its length, trimmed.
        bytes: usize,
    },
}

/// The cluster's shared peer secret, and the credential sent with every
/// peer call. Its `Debug` shows neither.
#[derive(Clone)]
pub struct PeerToken {
    /// HMAC-SHA256 keyed by the secret, fed the label: cloned to verify.
    keyed: HmacSha256,
    /// What a call carries: the hex of the finished HMAC.
    credential: AsciiMetadataValue,
}

impl std::fmt::Debug for PeerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerToken(<redacted>)")
    }
}

impl PeerToken {
    /// A token of `secret` (taken as it is: no trimming, no length check;
    /// [`PeerToken::load`] checks a file's).
    pub fn from_secret(secret: &[u8]) -> PeerToken {
        let mut keyed = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
        keyed.update(CREDENTIAL_LABEL);
        let credential = hex::encode(keyed.clone().finalize().into_bytes());
        let credential =
            AsciiMetadataValue::try_from(credential).expect("hex digits are valid metadata");
        PeerToken { keyed, credential }
    }

    /// Reads the token in `path`: its contents, white space around them
    /// trimmed, at least [`PEER_TOKEN_BYTES_MIN`] bytes.
    pub fn load(path: &Path) -> Result<PeerToken, PeerTokenError> {
        let bytes = std::fs::read(path).map_err(|source| PeerTokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let secret = bytes.trim_ascii();
        if secret.is_empty() {
            return Err(PeerTokenError::Empty {
                path: path.to_path_buf(),
            });
        }
        if secret.len() < PEER_TOKEN_BYTES_MIN {
            return Err(PeerTokenError::TooShort {
                path: path.to_path_buf(),
                bytes: secret.len(),
            });
        }
        Ok(PeerToken::from_secret(secret))
    }

    /// The credential a peer call carries in [`PEER_TOKEN_METADATA`].
    pub fn credential(&self) -> &AsciiMetadataValue {
        &self.credential
    }

    /// Puts the credential in `request`'s metadata.
    pub fn attach<T>(&self, request: &mut Request<T>) {
        request
            .metadata_mut()
            .insert(PEER_TOKEN_METADATA, self.credential.clone());
    }

    /// Checks the credential `metadata` carries, in constant time.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), TokenRefused> {
        let Some(value) = metadata.get(PEER_TOKEN_METADATA) else {
            return Err(TokenRefused::Missing);
        };
        // Only the caller's own bytes are examined here; the comparison
        // with the secret's credential is the HMAC's, in constant time.
        let received = hex::decode(value.as_bytes()).map_err(|_| TokenRefused::Wrong)?;
        self.keyed
            .clone()
            .verify_slice(&received)
            .map_err(|_| TokenRefused::Wrong)
    }
}

/// Why a peer call's token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefused {
    /// The call carries no token.
    #[error(
        "refused peer call: it carries no peer token, and this node requires one (start every node with the same --peer-token-file)"
    )]
    Missing,
    /// The call carries another token.
    #[error(
        "refused peer call: wrong peer token (every node must be started with the same --peer-token-file)"
    )]
    Wrong,
}

/// The permission bits of `path` that let its group or others read it,
/// if any (Unix; `None` elsewhere): a peer token file should be `0600`.
pub fn readable_by_others(path: &Path) -> std::io::Result<Option<u32>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
        Ok((mode & 0o044 != 0).then_some(mode))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(None)
    }
}

/// The peer port's check of every call's token, before its body is read:
/// a [`tonic::service::Interceptor`]. Without a token (`None`), every
/// call passes (peer TLS, or `--insecure-peers`, decides then).
#[derive(Clone, Debug, Default)]
pub struct PeerTokenCheck {
    token: Option<PeerToken>,
}

impl PeerTokenCheck {
    /// Checks calls against `token`, or lets every call through.
    pub fn new(token: Option<PeerToken>) -> PeerTokenCheck {
        PeerTokenCheck { token }
    }
}

impl tonic::service::Interceptor for PeerTokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(request);
        };
        match token.check(request.metadata()) {
            Ok(()) => Ok(request),
            Err(refusal) => {
                let caller = request
                    .remote_addr()
                    .map_or_else(|| "unknown".to_string(), |address| address.to_string());
                tracing::warn!(%caller, %refusal, "peer message refused");
                metrics::counter!("oncekv_peer_messages_refused_total").increment(1);
                Err(Status::unauthenticated(refusal.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn metadata(value: &str) -> MetadataMap {
        let mut map = MetadataMap::new();
        map.insert(
            PEER_TOKEN_METADATA,
            AsciiMetadataValue::try_from(value).expect("ascii"),
        );
        map
    }

    #[test]
    fn the_same_secret_passes_and_any_other_or_none_is_refused() {
        let token = PeerToken::from_secret(SECRET);
        let mut request = Request::new(());
        token.attach(&mut request);
        assert_eq!(token.check(request.metadata()), Ok(()));
        let same = PeerToken::from_secret(SECRET);
        assert_eq!(same.check(request.metadata()), Ok(()));
        let other = PeerToken::from_secret(b"0123456789abcdef0123456789abcdeF");
        assert_eq!(other.check(request.metadata()), Err(TokenRefused::Wrong));
        assert_eq!(token.check(&MetadataMap::new()), Err(TokenRefused::Missing));
        for forged in ["", "zz", "00", &"0".repeat(64)] {
            assert_eq!(token.check(&metadata(forged)), Err(TokenRefused::Wrong));
        }
        // The credential is not the secret.
        let credential = token.credential().to_str().expect("ascii");
        assert_eq!(credential.len(), 64);
        assert!(
            !credential
                .as_bytes()
                .windows(8)
                .any(|w| SECRET.windows(8).any(|s| s == w))
        );
        assert_eq!(format!("{token:?}"), "PeerToken(<redacted>)");
    }

    #[test]
    fn the_interceptor_answers_unauthenticated_before_the_body() {
        use tonic::service::Interceptor as _;
        let token = PeerToken::from_secret(SECRET);
        let mut check = PeerTokenCheck::new(Some(token.clone()));
        let refused = check.call(Request::new(())).expect_err("no token");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        assert!(
            refused.message().contains("--peer-token-file"),
            "{refused:?}"
        );
        let mut request = Request::new(());
        token.attach(&mut request);
        assert!(check.call(request).is_ok());
        let mut open = PeerTokenCheck::new(None);
        assert!(open.call(Request::new(())).is_ok());
    }

    #[test]
    fn a_token_file_is_trimmed_and_must_hold_32_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, [b"  \n", SECRET, b"\n\n"].concat()).expect("write");
        let loaded = PeerToken::load(&path).expect("a token");
        assert_eq!(
            loaded.credential(),
            PeerToken::from_secret(SECRET).credential()
        );
        std::fs::write(&path, " \n\t").expect("write");
        let empty = PeerToken::load(&path).expect_err("empty");
        assert!(matches!(empty, PeerTokenError::Empty { .. }), "{empty}");
        std::fs::write(&path, "short-secret\n").expect("write");
        let short = PeerToken::load(&path).expect_err("short");
        assert!(
            matches!(short, PeerTokenError::TooShort { bytes: 12, .. }),
            "{short}"
        );
        assert!(short.to_string().contains("create-token"), "{short}");
        let missing = PeerToken::load(&dir.path().join("nothing")).expect_err("missing");
        assert!(matches!(missing, PeerTokenError::Read { .. }), "{missing}");
    }

    #[cfg(unix)]
    #[test]
    fn a_token_file_others_can_read_is_noticed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, SECRET).expect("write");
        let chmod = |mode| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        chmod(0o600);
        assert_eq!(readable_by_others(&path).expect("metadata"), None);
        chmod(0o640);
        assert_eq!(readable_by_others(&path).expect("metadata"), Some(0o640));
        chmod(0o604);
        assert_eq!(readable_by_others(&path).expect("metadata"), Some(0o604));
    }
}
