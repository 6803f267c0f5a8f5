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

    // A client's TLS flag is refused before anything starts, naming the
    // node's own (it would otherwise be ignored and the node serve
    // plaintext); so are the other client-side flags.
    let fresh = dir.path().join("never-made");
    let fresh = fresh.to_str().expect("utf8 path");
    for (flag, instead) in [
        ("--cert", "--cert-file"),
        ("--key", "--key-file"),
        ("--cacert", "--client-ca-file"),
        ("--user", "oncekv user add"),
        ("--endpoints", "--listen-client"),
    ] {
        let (code, stderr) = serve(&[
            "--data-dir",
            fresh,
            "--listen-client",
            &client,
            "--listen-peer",
            &peer,
            flag,
            "x",
        ]);
        assert_eq!(code, 2, "{flag}: {stderr}");
        assert!(
            stderr.contains(&format!("{flag} is a client flag")) && stderr.contains(instead),
            "{flag}: {stderr}"
        );
    }
    assert!(
        !std::path::Path::new(fresh).exists(),
        "nothing is made for a refused start"
    );

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
    // A joining node must authenticate its peers: the cluster's token.
    let token = cluster.peer_token_file().expect("a token cluster");
    let mut joiner = Process::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(["serve", "--id", "2", "--join", "--data-dir"])
        .arg(&data)
        .args(["--listen-client", &client, "--listen-peer", &peer])
        .arg("--peer-token-file")
        .arg(token)
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

/// `deploy/grafana-dashboard.json` charts only metrics a node exports: a
/// 3-node cluster serves writes and snapshots, and its leader's `/metrics`
/// names every metric the dashboard queries (latency histograms, fsync,
/// apply, snapshot, leader changes, follower lag among them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_names_only_metrics_a_node_exports() {
    let _one = exclusive().await;
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana-dashboard.json"
        ))
        .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut wanted = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expression");
            let mut rest = expr;
            while let Some(start) = rest.find("oncekv_") {
                let name: String = rest[start..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                rest = &rest[start + name.len()..];
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(&name)
                    .to_string();
                wanted.insert(base);
            }
        }
    }
    assert!(wanted.len() >= 10, "{wanted:?}");
    let (mut cluster, metrics, _) =
        cluster_with_metrics(&[FAST, &["--snapshot-after-entries", "10"]].concat()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        // The leader's metrics: leadership may move in a new cluster, so
        // the writes go to the node leading now, whose metrics are read.
        let leader = cluster.leader(Duration::from_secs(20)).await;
        let endpoint = cluster.node(leader).client.clone();
        for _ in 0..30 {
            let out = Process::new(env!("CARGO_BIN_EXE_oncekv"))
                .args(["incr", "c", "--endpoints", &endpoint])
                .output()
                .expect("incr");
            assert!(out.status.success());
        }
        let address = metrics[usize::try_from(leader).expect("an id") - 1].clone();
        let body = http_get(&address, "/metrics").unwrap_or_default();
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|name| !body.contains(name.as_str()))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the dashboard queries metrics the node does not export: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A 3-node cluster started with `flags`, each node serving metrics: the
/// cluster, the nodes' metrics addresses and the leader's client address.
async fn cluster_with_metrics(flags: &[&str]) -> (Cluster, Vec<String>, String) {
    let mut cluster = Cluster::new(3, flags);
    let metrics: Vec<String> = (1..=3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    for (node, address) in cluster.nodes.iter_mut().zip(&metrics) {
        node.add_args(["--listen-metrics", address.as_str()]);
    }
    cluster.start_all().expect("start");
    let leader = cluster.leader(Duration::from_secs(20)).await;
    let endpoint = cluster.node(leader).client.clone();
    (cluster, metrics, endpoint)
}

/// The value of the metric line starting `series ` in a Prometheus text
/// body (0 when absent).
fn metric(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Replication goes over the pipelined stream by default and over unary
/// calls with `--peer-append unary`: a 3-node cluster of each serves
/// writes, and its nodes' `/metrics` count the appends they received by
/// call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_is_streamed_unless_told_unary() {
    let _one = exclusive().await;
    for mode in ["stream", "unary"] {
        let (_cluster, metrics, endpoint) =
            cluster_with_metrics(&[FAST, &["--peer-append", mode]].concat()).await;
        for expected in 1..=5 {
            let out = Process::new(env!("CARGO_BIN_EXE_oncekv"))
                .args(["incr", "c", "--endpoints", &endpoint])
                .output()
                .expect("incr");
            assert!(
                out.status.success(),
                "{mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                expected.to_string()
            );
        }
        let counts = |call: &'static str| {
            let metrics = metrics.clone();
            async move {
                let series = format!("oncekv_peer_appends_received_total{{call=\"{call}\"}}");
                let mut total = 0.0;
                for address in &metrics {
                    total += metric(&http_get(address, "/metrics")?, &series);
                }
                Some(total)
            }
        };
        let (used, unused) = match mode {
            "stream" => ("stream", "unary"),
            _ => ("unary", "stream"),
        };
        eventually(Duration::from_secs(10), "appends counted", || async {
            counts(used).await.filter(|count| *count >= 5.0)
        })
        .await;
        assert_eq!(counts(unused).await, Some(0.0), "{mode}");
    }
}
