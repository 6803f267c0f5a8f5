//! The files of `deploy/`: the systemd unit has what it must (`oncekv
//! serve` from an environment file, restarts, hardening), every variable
//! of the three example env files is one `oncekv serve` reads, the three
//! form one cluster sharing one peer token file, and, the proof, three
//! nodes started from them (on free loopback ports, temporary data
//! directories and a token made by `oncekv certs create-token`,
//! everything else as written) become healthy and stop cleanly.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::free_port;

const BINARY: &str = env!("CARGO_BIN_EXE_oncekv");

/// The variable the unit splits into extra `serve` flags.
const FLAGS: &str = "ONCEKV_FLAGS";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(name: &str) -> String {
    let path = deploy_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A systemd unit: section name to its (key, value) lines in order.
fn parse_unit(text: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut sections: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.entry(name.to_string()).or_default();
            current = Some(name.to_string());
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("unit line {}: not KEY=VALUE: {line}", number + 1));
        let section = current
            .clone()
            .unwrap_or_else(|| panic!("unit line {}: outside a section", number + 1));
        sections
            .entry(section)
            .or_default()
            .push((key.trim().to_string(), value.trim().to_string()));
    }
    sections
}

/// An env file: its variables in order, and the names of commented-out
/// ones (`#ONCEKV_...=`), which must be real too.
fn parse_env(name: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut variables = Vec::new();
    let mut commented = Vec::new();
    for (number, line) in read(name).lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            if let Some((key, _)) = rest.trim().split_once('=')
                && key.starts_with("ONCEKV_")
            {
                commented.push(key.to_string());
            }
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{name} line {}: not KEY=VALUE: {line}", number + 1));
        assert!(
            !value.starts_with('"') && !value.starts_with('\''),
            "{name}: {key} unquoted, as systemd and a shell read alike"
        );
        variables.push((key.to_string(), value.to_string()));
    }
    (variables, commented)
}

/// The environment variables and long flags `oncekv SUBCOMMAND --help`
/// names.
fn help_of(subcommand: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let output = Command::new(BINARY)
        .args([subcommand, "--help"])
        .env("COLUMNS", "200")
        .output()
        .expect("run oncekv serve --help");
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).expect("UTF-8");
    let words: Vec<&str> = help.split_whitespace().collect();
    let variables = words
        .windows(2)
        .filter(|pair| pair[0] == "[env:")
        .filter_map(|pair| pair[1].split('=').next())
        .map(str::to_string)
        .collect();
    let flags = words
        .iter()
        .filter_map(|word| word.strip_prefix("--"))
        .map(|flag| {
            flag.trim_end_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .to_string()
        })
        .filter(|flag| !flag.is_empty())
        .collect();
    (variables, flags)
}

fn value<'a>(variables: &'a [(String, String)], key: &str) -> &'a str {
    variables
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{key} is set"))
}

const NODES: [&str; 3] = ["node-1.env", "node-2.env", "node-3.env"];

#[test]
fn the_unit_runs_oncekv_serve_confined() {
    let unit = parse_unit(&read("oncekv.service"));
    for section in ["Unit", "Service", "Install"] {
        assert!(unit.contains_key(section), "[{section}] present");
    }
    let get = |section: &str, key: &str| -> String {
        unit[section]
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("[{section}] {key}= present"))
    };
    get("Unit", "Description");
    assert!(get("Unit", "After").contains("network-online.target"));
    assert_eq!(get("Install", "WantedBy"), "multi-user.target");

    let exec: Vec<String> = get("Service", "ExecStart")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert!(
        exec[0].starts_with('/') && exec[0].ends_with("/oncekv"),
        "an absolute path to oncekv: {exec:?}"
    );
    assert_eq!(exec[1], "serve", "{exec:?}");
    assert_eq!(
        exec[2..],
        [format!("${FLAGS}")],
        "flags from the env file, split at spaces"
    );
    assert!(get("Service", "EnvironmentFile").starts_with("/etc/oncekv/"));
    let user = get("Service", "User");
    assert!(
        !user.is_empty() && user != "root",
        "a dedicated user: {user}"
    );
    assert_eq!(get("Service", "Restart"), "on-failure");
    assert_eq!(get("Service", "NoNewPrivileges"), "true");
    assert_eq!(get("Service", "ProtectSystem"), "strict");
    assert_eq!(get("Service", "PrivateTmp"), "true");
    let files: u64 = get("Service", "LimitNOFILE").parse().expect("a number");
    assert!(files >= 4096, "LimitNOFILE={files}");
    // The data directory the env files name is writable, and only it.
    let writable = get("Service", "ReadWritePaths");
    for node in NODES {
        let (variables, _) = parse_env(node);
        let data = value(&variables, "ONCEKV_DATA_DIR");
        assert!(
            writable
                .split_whitespace()
                .any(|path| data.starts_with(path)),
            "{node}: {data} is under ReadWritePaths={writable}"
        );
    }
}

#[test]
fn the_env_files_form_one_cluster_of_known_flags() {
    let (known, flags) = help_of("serve");
    // The client commands' variables (`--endpoints`, `--user`, ...) are
    // accepted by `serve` too, as global flags, but do nothing there.
    let (client, _) = help_of("get");
    let client_only: BTreeSet<&String> = client.iter().filter(|key| *key != "ONCEKV_LOG").collect();
    assert!(client_only.iter().any(|key| *key == "ONCEKV_ENDPOINTS"));
    assert!(known.contains("ONCEKV_INITIAL_CLUSTER"), "{known:?}");
    assert!(flags.contains("heartbeat"), "{flags:?}");
    let mut clusters = BTreeSet::new();
    let mut tokens = BTreeSet::new();
    let mut addresses = BTreeSet::new();
    let mut names: Option<Vec<String>> = None;
    for (index, node) in NODES.iter().enumerate() {
        let (variables, commented) = parse_env(node);
        for (key, _) in &variables {
            assert!(
                known.contains(key) || key == FLAGS,
                "{node}: {key} is not a variable of `oncekv serve` ({known:?})"
            );
            assert!(
                !client_only.contains(key),
                "{node}: {key} is a client's variable, which serve ignores"
            );
        }
        for key in &commented {
            assert!(
                known.contains(key) && !client_only.contains(key),
                "{node}: commented {key} is not a variable of `oncekv serve`"
            );
        }
        let keys: Vec<String> = variables.iter().map(|(k, _)| k.clone()).collect();
        let unique: BTreeSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "{node}: a variable set twice");
        match &names {
            None => names = Some(keys),
            Some(first) => assert_eq!(first, &keys, "{node}: the same variables as node-1"),
        }
        for word in value(&variables, FLAGS).split_whitespace() {
            if let Some(flag) = word.strip_prefix("--") {
                assert!(
                    flags.contains(flag),
                    "{node}: --{flag} is not a flag of serve"
                );
            }
        }

        let id = value(&variables, "ONCEKV_ID");
        assert_eq!(id, (index + 1).to_string(), "{node}: its id");
        let client = value(&variables, "ONCEKV_LISTEN_CLIENT");
        let peer = value(&variables, "ONCEKV_LISTEN_PEER");
        for address in [client, peer, value(&variables, "ONCEKV_LISTEN_METRICS")] {
            assert!(
                address.parse::<std::net::SocketAddr>().is_ok(),
                "{node}: {address} is an address"
            );
            assert!(
                addresses.insert(address.to_string()),
                "{node}: {address} used twice"
            );
        }
        let cluster = value(&variables, "ONCEKV_INITIAL_CLUSTER");
        assert!(
            cluster
                .split(',')
                .any(|member| member == format!("{id}={peer}/{client}")),
            "{node}: {cluster} names this node as {id}={peer}/{client}"
        );
        clusters.insert(cluster.to_string());
        tokens.insert(value(&variables, "ONCEKV_PEER_TOKEN_FILE").to_string());
    }
    assert_eq!(tokens.len(), 1, "one peer token file: {tokens:?}");
    assert_eq!(
        clusters.len(),
        1,
        "one ONCEKV_INITIAL_CLUSTER: {clusters:?}"
    );
    let cluster = clusters.pop_first().expect("a cluster");
    let ids: Vec<&str> = cluster
        .split(',')
        .filter_map(|member| member.split_once('=').map(|(id, _)| id))
        .collect();
    assert_eq!(ids, ["1", "2", "3"], "{cluster}");
}

/// Node processes, killed if still running when dropped (a failed test).
struct Nodes(Vec<(Child, PathBuf)>);

impl Nodes {
    fn logs(&self) -> String {
        self.0
            .iter()
            .map(|(_, log)| {
                format!(
                    "--- {}\n{}",
                    log.display(),
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            })
            .collect()
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Replaces every address the files use by a free loopback one.
fn loopback_addresses(files: &[Vec<(String, String)>]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for variables in files {
        for (key, value) in variables {
            if key == FLAGS {
                continue;
            }
            for word in value.split([',', '=', '/']) {
                if word.parse::<std::net::SocketAddr>().is_ok() && !map.contains_key(word) {
                    map.insert(word.to_string(), format!("127.0.0.1:{}", free_port()));
                }
            }
        }
    }
    map
}

fn rewrite(value: &str, addresses: &BTreeMap<String, String>) -> String {
    // `ID=PEER/CLIENT,...`: rewrite whole addresses only.
    value
        .split(',')
        .map(|member| {
            let (head, rest) = match member.split_once('=') {
                Some((id, rest)) => (format!("{id}="), rest),
                None => (String::new(), member),
            };
            let rest: Vec<String> = rest
                .split('/')
                .map(|part| {
                    addresses
                        .get(part)
                        .cloned()
                        .unwrap_or_else(|| part.to_string())
                })
                .collect();
            format!("{head}{}", rest.join("/"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `command` without any `ONCEKV_*` variable of the test's environment.
fn clean(mut command: Command) -> Command {
    for (key, _) in std::env::vars() {
        if key.starts_with("ONCEKV_") {
            command.env_remove(key);
        }
    }
    command
}

#[test]
fn three_nodes_from_the_env_files_become_healthy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<Vec<(String, String)>> = NODES.iter().map(|node| parse_env(node).0).collect();
    let addresses = loopback_addresses(&files);
    let token = dir.path().join("peer-token");
    let made = clean(Command::new(BINARY))
        .args(["certs", "create-token", "--out"])
        .arg(&token)
        .output()
        .expect("run oncekv certs create-token");
    assert!(made.status.success(), "{made:?}");
    let mut nodes = Nodes(Vec::new());
    let mut clients = Vec::new();
    for (index, variables) in files.iter().enumerate() {
        let log = dir.path().join(format!("node-{}.log", index + 1));
        let mut command = clean(Command::new(BINARY));
        command.arg("serve");
        for (key, value) in variables {
            if key == FLAGS {
                // What systemd does with an unbraced $ONCEKV_FLAGS.
                command.args(value.split_whitespace());
            } else if key == "ONCEKV_DATA_DIR" {
                command.env(key, dir.path().join(format!("data-{}", index + 1)));
            } else if key == "ONCEKV_PEER_TOKEN_FILE" {
                // The one token file of the three, made as the README says.
                command.env(key, &token);
            } else {
                command.env(key, rewrite(value, &addresses));
            }
        }
        clients.push(rewrite(
            value(variables, "ONCEKV_LISTEN_CLIENT"),
            &addresses,
        ));
        let stderr = std::fs::File::create(&log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start oncekv serve");
        nodes.0.push((child, log));
    }
    for client in &clients {
        assert!(client.starts_with("127.0.0.1:"), "loopback only: {client}");
    }

    let endpoints = clients.join(",");
    let deadline = Instant::now() + Duration::from_secs(60);
    let last = loop {
        for (child, log) in &mut nodes.0 {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{} exited ({status}):\n{}",
                    log.display(),
                    std::fs::read_to_string(&*log).unwrap_or_default()
                );
            }
        }
        let output = clean(Command::new(BINARY))
            .args([
                "--endpoints",
                &endpoints,
                "--timeout",
                "2s",
                "endpoint",
                "health",
            ])
            .output()
            .expect("run oncekv endpoint health");
        let last = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if output.status.success() {
            break last;
        }
        assert!(
            Instant::now() < deadline,
            "not healthy in time: {last}\n{}",
            nodes.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(last.matches(" true ").count(), 3, "{last}");

    // Stopped as systemd stops them: SIGTERM by PID, a clean exit 0.
    for (child, log) in &mut nodes.0 {
        let pid = child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "SIGTERM to {pid}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "{} did not stop", log.display());
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            status.code(),
            Some(0),
            "a clean stop: {}",
            std::fs::read_to_string(&*log).unwrap_or_default()
        );
    }
}
