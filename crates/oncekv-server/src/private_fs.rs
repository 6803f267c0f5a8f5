//! Files and folders only the node's own user can read: the data directory
//! holds session secrets (in the log, the snapshots and the state), so it
//! is made `0700` on every start and every file the node creates in it is
//! `0600` (on Unix; elsewhere the platform's defaults apply).

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Options for a new file readable and writable by this user only.
pub fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

/// Creates (or truncates) `path` as a private file, for writing.
pub fn create(path: &Path) -> io::Result<File> {
    options().write(true).create(true).truncate(true).open(path)
}

/// Makes `dir` and its missing parents, and `dir` itself private.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn folders_are_0700_and_files_0600_even_where_the_folder_existed_open() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        create_dir(&dir).expect("private dir");
        let mode = |path: &Path| {
            std::fs::metadata(path)
                .expect("metadata")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(&dir), 0o700);
        let file = dir.join("secret");
        create(&file).expect("private file");
        assert_eq!(mode(&file), 0o600);
    }
}
