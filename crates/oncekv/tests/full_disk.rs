//! A full disk: the node stops with a clear error and exit code 12, no
//! acknowledged write is lost, and once space is freed the node restarts
//! and serves every acknowledged write. The disk is a small tmpfs mounted
//! in a mount namespace of the test's own, which ends with the test, so
//! nothing outside it ever sees the mount (needs root; otherwise skipped,
//! and listed by `cargo xtask verify`, or failed under `CI=true`:
//! `oncekv_harness::testing::missing_dependency`).

mod support;

use oncekv_proto::v1;
use oncekv_state::{Command, Outcome, Query, Reply, Request};
use std::path::Path;
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};
use support::{Cluster, Dependency, FAST, eventually, execute_on, missing_dependency};

/// A tmpfs over one directory, inside a private mount namespace held open
/// by a `sleep` process; processes join it through `nsenter`.
struct PrivateDisk {
    holder: Child,
    mount_point: String,
}

impl PrivateDisk {
    /// Mounts a tmpfs of `size` (`4m`) at `mount_point` in a new mount
    /// namespace; `None`, with the reason, where that is not possible.
    fn mount(mount_point: &Path, size: &str) -> Result<PrivateDisk, String> {
        std::fs::create_dir_all(mount_point).map_err(|e| e.to_string())?;
        let holder = Process::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("unshare: {e}"))?;
        let mut disk = PrivateDisk {
            holder,
            mount_point: mount_point.display().to_string(),
        };
        // The holder is in its namespace once it runs `sleep`.
        let own = std::fs::read_link("/proc/self/ns/mnt").map_err(|e| e.to_string())?;
        let namespace = format!("/proc/{}/ns/mnt", disk.holder.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_link(&namespace).map_err(|e| e.to_string())? == own {
            if Instant::now() > deadline || disk.holder.try_wait().ok().flatten().is_some() {
                return Err("unshare --mount did not start a mount namespace".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let options = format!("size={size}");
        disk.run(&["mount", "-t", "tmpfs", "-o", &options, "oncekv-test-disk"])?;
        Ok(disk)
    }

    /// The command prefix that runs a program inside the namespace.
    fn launcher(&self) -> Vec<String> {
        let pid = self.holder.id().to_string();
        ["nsenter", "-t", &pid, "-m", "--"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Runs `args` followed by the mount point inside the namespace.
    fn run(&self, args: &[&str]) -> Result<(), String> {
        let launcher = self.launcher();
        let output = Process::new(&launcher[0])
            .args(&launcher[1..])
            .args(args)
            .arg(&self.mount_point)
            .output()
            .map_err(|e| format!("{}: {e}", launcher[0]))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// Grows (or shrinks) the tmpfs.
    fn resize(&self, size: &str) {
        let options = format!("remount,size={size}");
        self.run(&["mount", "-o", &options])
            .expect("resize the tmpfs");
    }
}

impl Drop for PrivateDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

fn value_of(index: usize) -> Vec<u8> {
    (0..64 * 1024).map(|at| (at + index) as u8).collect()
}

fn put(index: usize) -> Request {
    Request::plain(Command::Put {
        key: format!("key{index}").into_bytes(),
        value: value_of(index).into(),
        lease: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_node_clearly_and_loses_no_acknowledged_write() {
    let _one = support::exclusive().await;
    let mut cluster = Cluster::new(1, FAST);
    let disk = match PrivateDisk::mount(&cluster.node(1).data_dir, "4m") {
        Ok(disk) => disk,
        Err(why) => {
            missing_dependency(
                "full_disk::a_full_disk_stops_the_node_clearly_and_loses_no_acknowledged_write",
                Dependency::Root,
                &format!("no private tmpfs to fill here: {why}"),
            );
            return;
        }
    };
    cluster.node(1).launcher = disk.launcher();
    cluster.node(1).spawn();
    cluster.leader(Duration::from_secs(20)).await;

    // Fill the disk with 64 KiB values until a write is refused.
    let client = cluster.node(1).client.clone();
    let mut acknowledged = Vec::new();
    let mut refusal = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    for index in 0..500 {
        assert!(Instant::now() < deadline, "the disk did not fill in time");
        match execute_on(&client, &put(index)).await.map(|r| r.result) {
            Ok(Some(v1::execute_response::Result::Outcome(outcome))) => {
                let outcome = oncekv_proto::convert::outcome_from_wire(outcome);
                assert!(
                    matches!(outcome, Ok(Outcome::Applied(_))),
                    "write {index}: {outcome:?}"
                );
                acknowledged.push(index);
            }
            other => {
                refusal = Some(format!("{other:?}"));
                break;
            }
        }
    }
    let refusal = refusal.expect("4 MiB never filled: no write was refused");
    eprintln!(
        "{} writes acknowledged before the disk was full, then: {refusal}",
        acknowledged.len()
    );
    assert!(
        acknowledged.len() >= 10,
        "only {} writes before the disk was full: {refusal}",
        acknowledged.len()
    );

    // The node stops by itself, saying why.
    let node = cluster.node(1);
    let mut child = node.child.take().expect("running");
    let status = eventually(Duration::from_secs(20), "the node to stop", || {
        let exited = child.try_wait().expect("wait");
        async move { exited }
    })
    .await;
    let log = cluster.logs();
    assert_eq!(status.code(), Some(12), "{log}");
    assert!(
        log.contains("disk holding the data directory is full"),
        "no clear message:\n{log}"
    );

    // Freed space: it restarts and has every acknowledged write.
    disk.resize("64m");
    cluster.node(1).spawn();
    cluster.leader(Duration::from_secs(20)).await;
    let node = cluster.node(1);
    for index in &acknowledged {
        let key = format!("key{index}").into_bytes();
        let value = node.read(&Query::Get { key }, false).await;
        assert!(
            matches!(&value, Ok(Reply::Get { value: Some(v), .. }) if *v == value_of(*index)),
            "acknowledged write {index} lost after the restart"
        );
    }
    let next = acknowledged.len() + 1;
    let outcome = cluster.outcome(&put(next), Duration::from_secs(20)).await;
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
}
