//! [`PrivateDisks`]: a small disk of its own for each node's data
//! directory, so a run can fill one (the `full-disk` fault kind,
//! [`crate::nemesis`]). Each disk is a tmpfs mounted over the node's data
//! directory inside a mount namespace of the cluster's own, held open by
//! a `sleep` process (`unshare --mount --propagation private sleep N`);
//! the nodes are started in it through `nsenter -t <holder> -m --`
//! ([`PrivateDisks::launcher`]). Nothing outside that namespace ever sees
//! the mounts: the harness itself sees each data directory as an empty
//! folder. The holder is killed when the disks are dropped (after the
//! nodes: [`crate::cluster::Cluster`] drops them after its processes);
//! the namespace, and every tmpfs in it, ends with the last process in
//! it. A holder left by a harness that was killed outright ends when its
//! sleep does: the run bounds it by its own length plus a margin
//! ([`DiskOptions::lifetime`]).
//!
//! Filling a disk ([`PrivateDisks::fill`]) allocates its free space to
//! filler files in the data directory (`fallocate` run in the namespace),
//! so the node's next write that needs a new page fails with ENOSPC;
//! [`PrivateDisks::free`] removes them. Needs root, and util-linux's
//! `unshare`, `nsenter`, `mount`, `stat` and `fallocate`
//! ([`available`]).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The size of each node's disk in a `full-disk` run: far more than a
/// node writes in a long run with the run's snapshot and log settings
/// (a 60 s run's node holds a few MiB), so only the filler fills it. A
/// tmpfs takes memory only for what is written.
pub const DISK_SIZE: &str = "512m";

/// How the nodes' disks are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskOptions {
    /// The size of each tmpfs, as `mount -o size=` takes it (`512m`).
    pub size: String,
    /// How long the namespace's holder lives at most (its `sleep`): the
    /// longest the cluster may run, plus a margin. A node cannot be
    /// started in the namespace after it ends.
    pub lifetime: Duration,
}

/// The name filler files begin with, in a full disk's data directory.
pub const FILLER_PREFIX: &str = "full-disk-filler-";

/// How many times a fill is tried again when the node wrote between
/// measuring the free space and taking it.
const FILL_TRIES: usize = 8;

/// Why a mount namespace with a tmpfs cannot be made here, if it cannot:
/// not root, a tool missing, or the kernel refusing (a container without
/// the capability). Tried once, for real, per process.
pub fn available() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    for tool in ["unshare", "nsenter", "mount", "umount", "stat", "fallocate"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        if !found {
            return Err(format!("`{tool}` (util-linux) is not on PATH"));
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("oncekv-disk-probe-")
        .tempdir()
        .map_err(|e| format!("a folder to mount on: {e}"))?;
    // A namespace that ends with the command: the mount goes with it.
    let output = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "mount",
            "-t",
            "tmpfs",
        ])
        .args(["-o", "size=1m", "oncekv-disk-probe"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("unshare: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cannot mount a tmpfs in a private mount namespace (needs root): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// What a disk holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Bytes in use.
    pub used: u64,
    /// Bytes free.
    pub free: u64,
    /// The disk's size.
    pub size: u64,
}

impl Usage {
    /// `used` in KiB, rounded up.
    pub fn used_kib(&self) -> u64 {
        self.used.div_ceil(1 << 10)
    }

    /// `size` in MiB.
    pub fn size_mib(&self) -> u64 {
        self.size >> 20
    }
}

/// A mount namespace holding a tmpfs over each node's data directory.
#[derive(Debug)]
pub struct PrivateDisks {
    holder: Mutex<Child>,
    pid: u32,
    size: String,
}

fn failure(what: impl Into<String>) -> std::io::Error {
    std::io::Error::other(what.into())
}

impl PrivateDisks {
    /// Makes the namespace (its holder sleeping for `options.lifetime`);
    /// no disk is mounted yet ([`PrivateDisks::mount`]).
    pub fn create(options: &DiskOptions) -> std::io::Result<PrivateDisks> {
        let seconds = options.lifetime.as_secs().max(1).to_string();
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", &seconds])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| failure(format!("unshare: {e}")))?;
        let pid = holder.id();
        let disks = PrivateDisks {
            holder: Mutex::new(holder),
            pid,
            size: options.size.clone(),
        };
        // The holder is in its namespace once `unshare` has exec'd `sleep`.
        let own = std::fs::read_link("/proc/self/ns/mnt")?;
        let namespace = format!("/proc/{pid}/ns/mnt");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if std::fs::read_link(&namespace).is_ok_and(|theirs| theirs != own) {
                return Ok(disks);
            }
            let exited = disks
                .holder
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .try_wait()?;
            if let Some(status) = exited {
                return Err(failure(format!(
                    "unshare --mount exited ({status}) before making a mount namespace"
                )));
            }
            if Instant::now() > deadline {
                return Err(failure("unshare --mount made no mount namespace in 10 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The holder's process id.
    pub fn holder_pid(&self) -> u32 {
        self.pid
    }

    /// The command prefix that runs a program in the namespace.
    pub fn launcher(&self) -> Vec<String> {
        let pid = self.pid.to_string();
        ["nsenter", "-t", pid.as_str(), "-m", "--"]
            .iter()
            .map(|s| (*s).to_string())
            .collect()
    }

    /// Runs `args` in the namespace; its standard output.
    fn run(&self, args: &[&str]) -> std::io::Result<String> {
        let launcher = self.launcher();
        let output = Command::new(&launcher[0])
            .args(&launcher[1..])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failure(format!("nsenter: {e}")))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(failure(format!(
                "`{}` in the disks' namespace: {}: {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// Mounts a disk of its own over `dir` (made if missing), private to
    /// its user (`mode=0700`, as the node makes its data directory).
    pub fn mount(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let options = format!("size={},mode=0700", self.size);
        self.run(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            &options,
            "oncekv-disk",
            &text(dir),
        ])
        .map(drop)
    }

    /// Unmounts the disk over `dir`, if there is one (its contents go).
    pub fn unmount(&self, dir: &Path) {
        let _ = self.run(&["umount", "-l", &text(dir)]);
    }

    /// What the disk over `dir` holds.
    pub fn usage(&self, dir: &Path) -> std::io::Result<Usage> {
        // Free blocks (to a user), all blocks, the block size.
        let out = self.run(&["stat", "-f", "-c", "%a %b %S", &text(dir)])?;
        let numbers: Vec<u64> = out
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let &[free, blocks, block] = numbers.as_slice() else {
            return Err(failure(format!("stat -f said `{}`", out.trim())));
        };
        Ok(Usage {
            used: blocks.saturating_sub(free) * block,
            free: free * block,
            size: blocks * block,
        })
    }

    /// Fills the disk over `dir`: filler files in it take every free
    /// block, so the next write that needs one fails with ENOSPC. What
    /// the disk held before.
    pub fn fill(&self, dir: &Path) -> std::io::Result<Usage> {
        let before = self.usage(dir)?;
        let mut last = String::new();
        for attempt in 0..FILL_TRIES {
            let usage = self.usage(dir)?;
            if usage.free == 0 {
                return Ok(before);
            }
            // A write between measuring and taking the space makes this
            // fail, and take nothing: measured again, tried again.
            let filler = dir.join(format!("{FILLER_PREFIX}{attempt}"));
            match self.run(&["fallocate", "-l", &usage.free.to_string(), &text(&filler)]) {
                Ok(_) => {}
                Err(error) => last = error.to_string(),
            }
        }
        if self.usage(dir)?.free == 0 {
            return Ok(before);
        }
        Err(failure(format!(
            "{} still had free space after {FILL_TRIES} fills: {last}",
            dir.display()
        )))
    }

    /// Whether a disk is mounted over `dir` in the namespace.
    pub fn is_mounted(&self, dir: &Path) -> bool {
        let dir = text(dir);
        self.run(&["cat", "/proc/self/mounts"])
            .unwrap_or_default()
            .lines()
            .any(|line| line.split_whitespace().nth(1) == Some(dir.as_str()))
    }

    /// Removes the filler files from the disk over `dir`.
    pub fn free(&self, dir: &Path) -> std::io::Result<()> {
        let fillers: Vec<String> = (0..FILL_TRIES)
            .map(|attempt| text(&dir.join(format!("{FILLER_PREFIX}{attempt}"))))
            .collect();
        let mut args = vec!["rm", "-f", "--"];
        args.extend(fillers.iter().map(String::as_str));
        self.run(&args).map(drop)
    }
}

impl Drop for PrivateDisks {
    fn drop(&mut self) {
        let holder = self
            .holder
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let _ = holder.kill();
        let _ = holder.wait();
    }
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> DiskOptions {
        DiskOptions {
            size: "4m".into(),
            lifetime: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_private_disk_fills_frees_and_goes_with_its_holder() {
        if let Err(why) = available() {
            crate::testing::missing_dependency(
                "disk::tests::a_private_disk_fills_frees_and_goes_with_its_holder",
                crate::testing::Dependency::Root,
                &why,
            );
            return;
        }
        let folder = tempfile::tempdir().expect("a folder");
        let dir = folder.path().join("node-1");
        let disks = PrivateDisks::create(&options()).expect("a namespace");
        disks.mount(&dir).expect("a tmpfs");
        assert!(disks.is_mounted(&dir));
        // Outside the namespace nothing is mounted there.
        let here = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
        assert!(!here.contains(&text(&dir)), "{here}");

        // A file written through the launcher is on the disk.
        let write = |name: &str, bytes: usize| {
            let launcher = disks.launcher();
            Command::new(&launcher[0])
                .args(&launcher[1..])
                .args(["sh", "-c", "head -c \"$1\" /dev/zero > \"$2\"", "sh"])
                .arg(bytes.to_string())
                .arg(dir.join(name))
                .stderr(Stdio::null())
                .status()
                .expect("sh")
                .success()
        };
        assert!(write("data", 100_000));
        assert!(!dir.join("data").exists(), "written on the private disk");
        let before = disks.usage(&dir).expect("usage");
        assert_eq!(before.size_mib(), 4);
        assert!(before.used >= 100_000 && before.free > 0, "{before:?}");

        let held = disks.fill(&dir).expect("filled");
        assert_eq!(held.used, before.used);
        assert_eq!(disks.usage(&dir).expect("usage").free, 0);
        assert!(!write("more", 8192), "a full disk refuses a write");

        disks.free(&dir).expect("freed");
        assert_eq!(disks.usage(&dir).expect("usage"), before);
        assert!(write("more", 8192), "a freed disk takes it");

        disks.unmount(&dir);
        assert!(!disks.is_mounted(&dir));
        let pid = disks.holder_pid();
        drop(disks);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the holder goes with the disks"
        );
    }
}
