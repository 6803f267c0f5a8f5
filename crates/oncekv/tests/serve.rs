//! `oncekv serve` as an operator meets it: errors one can act on (with
//! their exit codes), membership changes of a running cluster, and the
//! Prometheus endpoint.

mod support;

use std::io::{Read, Write};
use std::process::{Command as Process, Stdio};
use std::time::Duration;
use support::{Cluster, FAST, eventually, exclusive, free_port};

fn serve(args: &[&str]) -> (i32, String) {
    let output = Process::new(env!("CARGO_BIN_EXE_oncekv"))
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run oncekv serve");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn startup_errors_say_what_to_fix_with_documented_exit_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf8 path");
    let client = format!("127.0.0.1:{}", free_port());
    let peer = format!("127.0.0.1:{}", free_port());
    let base = [
        "--data-dir",
        data,
        "--listen-client",
        &client,
        "--listen-peer",
        &peer,
    ];

    // The id must be in the initial cluster: a usage error.
    let cluster = format!("2={peer}/{client}");
    let (code, stderr) =
        serve(&[&base[..], &["--id", "1", "--initial-cluster", &cluster]].concat());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not in --initial-cluster"), "{stderr}");

    // A port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = taken.local_addr().expect("addr").to_string();
    let (code, stderr) = serve(&[
        "--data-dir",
        data,
        "--listen-client",
        &taken,
        "--listen-peer",
        &peer,
    ]);
    assert_eq!(code, 11, "{stderr}");
    assert!(
        stderr.contains(&taken) && stderr.contains("in use"),
        "{stderr}"
    );

    // A data directory that cannot be created.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").expect("file");
    let below_file = file.join("data");
    let (code, stderr) = serve(&[
        "--data-dir",
        below_file.to_str().expect("utf8"),
        "--listen-client",
        &client,
        "--listen-peer",
        &peer,
    ]);
    assert_eq!(code, 10, "{stderr}");
    assert!(stderr.contains("data directory"), "{stderr}");

    // A data directory that belongs to another node id.
    std::fs::create_dir_all(data).expect("dir");
    std::fs::write(
        dir.path().join("data/identity"),
        format!("id=7\ncluster=7={peer}/{client}\n"),
    )
    .expect("identity");
    let (code, stderr) = serve(&base);
    assert_eq!(code, 10, "{stderr}");
    assert!(stderr.contains("belongs to node 7"), "{stderr}");

    // ... or to another cluster.
    std::fs::write(
        dir.path().join("data/identity"),
        "id=1\ncluster=1=elsewhere:1/elsewhere:2\n",
    )
    .expect("identity");
    let (code, stderr) = serve(&base);
    assert_eq!(code, 10, "{stderr}");
    assert!(stderr.contains("cluster"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_and_leaves_a_running_cluster() {
    let _one = exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let endpoint = cluster.node(1).client.clone();
    let (client, peer) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let data = cluster.dir.path().join("joiner");
    let mut joiner = Process::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--id", "2", "--join", "--data-dir"])
        .arg(&data)
        .args(["--listen-client", &client, "--listen-peer", &peer])
        .args(FAST)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn joiner");
    let cli = |args: &[&str]| {
        Process::new(env!("CARGO_BIN_EXE_oncekv"))
            .args(args)
            .args(["--endpoints", &endpoint, "-o", "json"])
            .output()
            .expect("run oncekv")
    };
    let added = cli(&["member", "add", "2", "--peer", &peer, "--client", &client]);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let listed: serde_json::Value =
        serde_json::from_slice(&cli(&["member", "list"]).stdout).expect("json");
    let voters: Vec<u64> = listed["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["voter"] == true)
        .map(|m| m["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(voters, vec![1, 2], "{listed}");
    // The new member has the data, and writes need both nodes now.
    let put = cli(&["put", "k", "v"]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let joined = Process::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["get", "k", "--serializable", "--endpoints", &client])
        .output()
        .expect("get");
    assert_eq!(String::from_utf8_lossy(&joined.stdout).trim(), "v");
    let removed = cli(&["member", "remove", "2"]);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let listed: serde_json::Value =
        serde_json::from_slice(&cli(&["member", "list"]).stdout).expect("json");
    assert_eq!(
        listed["members"].as_array().expect("members").len(),
        1,
        "{listed}"
    );
    let _ = joiner.kill();
    let _ = joiner.wait();
}

fn http_get(address: &str, path: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_in_prometheus_format() {
    let _one = exclusive().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let flags: Vec<&str> = FAST
        .iter()
        .copied()
        .chain(["--listen-metrics", metrics.as_str()])
        .collect();
    let mut cluster = Cluster::start(1, &flags);
    cluster.leader(Duration::from_secs(15)).await;
    let endpoint = cluster.node(1).client.clone();
    let out = Process::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["incr", "c", "--endpoints", &endpoint])
        .output()
        .expect("incr");
    assert!(out.status.success());
    let body = eventually(Duration::from_secs(10), "metrics", || {
        let metrics = metrics.clone();
        async move {
            http_get(&metrics, "/metrics").filter(|b| {
                b.contains("oncekv_raft_is_leader 1") && b.contains("oncekv_requests_total")
            })
        }
    })
    .await;
    assert!(body.contains("outcome=\"applied\""), "{body}");
    assert!(body.contains("oncekv_sessions"), "{body}");
}
