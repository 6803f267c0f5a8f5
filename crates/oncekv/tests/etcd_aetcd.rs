//! An established etcd client's own test suite against oncekv: the
//! integration tests of aetcd 1.0.0 (an asyncio etcd client for Python;
//! `tests/integration` of its sdist) run once against a real one-member
//! etcd and once against an oncekv node, and every test that passes
//! against etcd must pass against oncekv too, except those listed in
//! [`EXPECTED_TO_DIFFER`], each with the reason. A listed test must still
//! fail against oncekv, so the list can only shrink.
//!
//! The suite finds its server through `TEST_ETCD_HTTP_URL` and drives
//! `etcdctl` beside the client (to write what the client reads, and the
//! other way round). scripts/setup.sh makes it in `target/aetcd-suite`: a
//! virtual environment with aetcd and the test extras its pyproject.toml
//! pins, and the sdist's `tests/` and `pyproject.toml` (pytest's settings
//! for them) beside it. Without the suite, `etcd` or `etcdctl` the test
//! says so (and fails in CI). Each run's outcomes are read from pytest's
//! JUnit XML report.

mod support;

use oncekv_harness::testing::{EtcdProcess, on_path};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use support::{Cluster, Dependency, FAST, eventually, exclusive, missing_dependency};

/// This test's name, for [`missing_dependency`].
const TEST: &str = "etcd_aetcd::aetcd_tests_that_pass_against_etcd_pass_against_oncekv";

/// Where scripts/setup.sh makes the suite: `venv/`, `tests/` and
/// `pyproject.toml`, and the `ready` file it writes last.
const SUITE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/aetcd-suite");

/// The longest one run of the suite may take before it is killed. A run
/// takes about a minute on an idle machine, most of it the suite's own
/// sleeps (leases left to expire, writes made for a watch to see).
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Longest one of the suite's tests may run. Some wait for events their
/// own writer sends after a fixed sleep, and wait forever if the watch
/// started late on a loaded machine and missed one: such a test fails
/// after this long (and, failing against oncekv alone, runs once more)
/// instead of holding the whole run until [`RUN_TIMEOUT`].
const TEST_LIMIT_SECONDS: u32 = 60;

/// A pytest plugin, loaded with `-p`, that fails a test running past
/// [`TEST_LIMIT_SECONDS`], setup and teardown included. SIGALRM raises in
/// whatever the main thread runs; where that is a callback asyncio or grpc
/// swallows the exception, the timer fires again every few seconds until
/// it ends the test. The first firing prints every asyncio task's stack,
/// so a hang says where it waits; a test still running a minute later
/// has every thread's stack printed and ends the run (a broken run, which
/// the test reports with the log's end).
const TEST_LIMIT_PLUGIN: &str = r#"
import asyncio
import faulthandler
import os
import signal
import sys
import pytest

LIMIT = int(os.environ["ONCEKV_TEST_LIMIT_SECONDS"])
AGAIN_EVERY = 5
LAST_RESORT = 60


class TestTooLong(Exception):
    pass


_fired = []


def _alarm(signum, frame):
    if not _fired:
        _fired.append(True)
        print(f"\n== the test ran past {LIMIT} s; its asyncio tasks:", file=sys.stderr)
        try:
            for task in asyncio.all_tasks(asyncio.get_running_loop()):
                task.print_stack(file=sys.stderr)
        except RuntimeError:
            print("(no running event loop)", file=sys.stderr)
        sys.stderr.flush()
    raise TestTooLong(f"the test ran past {LIMIT} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _fired.clear()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT, AGAIN_EVERY)
    faulthandler.dump_traceback_later(LIMIT + LAST_RESORT, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
"#;

/// The fewest tests that must pass against etcd for the comparison to
/// mean anything: 60 of the suite's 63 do against Debian's etcd 3.4 (one
/// connects to `localhost:2379` whatever `TEST_ETCD_HTTP_URL` says, two
/// need a three-member cluster), and a broken environment (no `etcdctl`,
/// a suite that cannot import) fails nearly all of them.
const AT_LEAST_PASSING_ON_ETCD: usize = 55;

/// The tests (`classname::name`, as pytest's JUnit report names them) that
/// pass against etcd and do not pass against oncekv yet, each with why.
/// The test fails if one of them passes against oncekv: take it off then.
const EXPECTED_TO_DIFFER: &[(&str, &str)] = &[(
    "tests.integration.test_maintenance::test_snapshot",
    "a snapshot is oncekv's backup, not etcd's bbolt database, so `etcdctl snapshot \
         status` cannot read it",
)];

/// What became of one test in one run.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Passed,
    Skipped,
    /// A failure or an error (in the test or its fixtures), with pytest's
    /// message and report.
    Failed(String),
}

/// One run of the suite against one server.
#[derive(Debug)]
struct SuiteRun {
    /// Each test's outcome, by `classname::name`.
    outcomes: BTreeMap<String, Outcome>,
    /// pytest's closing line (`N failed, N passed, ... in Ns`).
    closing_line: String,
}

impl SuiteRun {
    /// The number of tests with each kind of outcome: passed, failed,
    /// skipped.
    fn counts(&self) -> (usize, usize, usize) {
        let count =
            |wanted: fn(&Outcome) -> bool| self.outcomes.values().filter(|o| wanted(o)).count();
        (
            count(|o| *o == Outcome::Passed),
            count(|o| matches!(o, Outcome::Failed(_))),
            count(|o| *o == Outcome::Skipped),
        )
    }

    /// A one-line summary of the run.
    fn summary(&self, server: &str) -> String {
        let (passed, failed, skipped) = self.counts();
        format!(
            "aetcd suite against {server}: {passed} passed, {failed} failed, {skipped} skipped \
             (pytest: {})",
            self.closing_line
        )
    }
}

/// Why the suite cannot run here, if it cannot: what is missing from
/// `target/aetcd-suite`.
fn missing_suite_part() -> Option<String> {
    let suite = Path::new(SUITE);
    [
        "ready",
        "venv/bin/python",
        "pyproject.toml",
        "tests/integration/conftest.py",
    ]
    .into_iter()
    .find(|part| !suite.join(part).exists())
    .map(|part| format!("no target/aetcd-suite/{part}"))
}

/// Runs `etcdctl ARGS` against `endpoint` (`host:port`); whether it
/// succeeded.
async fn etcdctl_succeeds(endpoint: &str, args: &[&str]) -> bool {
    tokio::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "--command-timeout", "2s"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .is_ok_and(|status| status.success())
}

/// Waits until `endpoint` answers `etcdctl get`.
async fn answering(endpoint: &str) {
    eventually(
        Duration::from_secs(30),
        &format!("{endpoint} to answer etcdctl"),
        || async {
            etcdctl_succeeds(endpoint, &["get", "ready"])
                .await
                .then_some(())
        },
    )
    .await;
}

/// The last `lines` lines of the file at `path`, for a failure message.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs the suite against the etcd API at `endpoint` (`host:port`), named
/// `server` in the files it leaves in `scratch` and in messages; kills it
/// if it overruns [`RUN_TIMEOUT`].
async fn run_suite(server: &str, endpoint: &str, scratch: &Path, tests: &[String]) -> SuiteRun {
    let run_name = if tests.is_empty() {
        server.to_string()
    } else {
        format!("{server}-again")
    };
    let report: PathBuf = scratch.join(format!("{run_name}.xml"));
    let log_path = scratch.join(format!("{run_name}.log"));
    let log = std::fs::File::create(&log_path).expect("the suite's log");
    eprintln!("running the aetcd suite against {server} ({endpoint})");
    std::fs::write(scratch.join("oncekv_test_limit.py"), TEST_LIMIT_PLUGIN)
        .expect("the per-test limit plugin");
    let mut child = tokio::process::Command::new(Path::new(SUITE).join("venv/bin/python"))
        // The suite's pyproject.toml asks for coverage of aetcd, which
        // this comparison does not need.
        .args(["-m", "pytest", "-p", "no:cacheprovider", "--no-cov"])
        .args(["-p", "oncekv_test_limit"])
        .env("PYTHONPATH", scratch)
        .env("ONCEKV_TEST_LIMIT_SECONDS", TEST_LIMIT_SECONDS.to_string())
        .args(if tests.is_empty() {
            vec!["tests/integration".to_string()]
        } else {
            tests.iter().map(|id| pytest_node(id)).collect()
        })
        .arg(format!("--junitxml={}", report.display()))
        .current_dir(SUITE)
        .env("TEST_ETCD_HTTP_URL", format!("http://{endpoint}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the suite's log"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("run pytest in target/aetcd-suite/venv");
    let status = match tokio::time::timeout(RUN_TIMEOUT, child.wait()).await {
        Ok(status) => status.expect("wait for pytest"),
        Err(_) => {
            let _ = child.kill().await;
            panic!(
                "the aetcd suite against {server} did not finish within {RUN_TIMEOUT:?}; \
                 the end of its output:\n{}",
                tail(&log_path, 200)
            );
        }
    };
    // pytest exits with 1 when tests failed; any other code but 0 means
    // the run itself went wrong (usage, collection, an interruption).
    assert!(
        matches!(status.code(), Some(0 | 1)),
        "the aetcd suite against {server} ended with {status}; the end of its output:\n{}",
        tail(&log_path, 200)
    );
    let xml = std::fs::read_to_string(&report).expect("pytest's JUnit report");
    let outcomes = parse_junit(&xml).unwrap_or_else(|error| {
        panic!("pytest's JUnit report against {server} cannot be read: {error}\n{xml}")
    });
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    // Its closing line is the last one framed by `=` that says how long the
    // run took; what the suite's leftover tasks print comes after it.
    let closing_line = output
        .lines()
        .rev()
        .find(|line| line.starts_with('=') && line.ends_with('=') && line.contains(" in "))
        .unwrap_or("no closing line")
        .trim_matches(|c| c == '=' || c == ' ')
        .to_string();
    SuiteRun {
        outcomes,
        closing_line,
    }
}

/// pytest's node id of the test `classname::name`
/// (`tests.integration.test_kv::test_x` is
/// `tests/integration/test_kv.py::test_x`).
fn pytest_node(id: &str) -> String {
    let (classname, name) = id.split_once("::").unwrap_or((id, ""));
    format!("{}.py::{name}", classname.replace('.', "/"))
}

/// The tests that pass against etcd, are not listed, and did not pass
/// against oncekv: what a second run against oncekv retries.
fn unlisted_failures(etcd: &SuiteRun, oncekv: &SuiteRun, listed: &[(&str, &str)]) -> Vec<String> {
    etcd.outcomes
        .iter()
        .filter(|(id, outcome)| {
            **outcome == Outcome::Passed
                && oncekv.outcomes.get(*id) != Some(&Outcome::Passed)
                && !listed.iter().any(|(name, _)| name == id)
        })
        .map(|(id, _)| id.clone())
        .collect()
}

/// The outcomes in a JUnit XML report as pytest writes it: one
/// `<testcase classname=".." name="..">` per test, with a `<failure>` or
/// `<error>` child if it failed (an error in a fixture's teardown is added
/// to a test that passed) and a `<skipped>` child if it was skipped. A
/// test that failed and then errored in a teardown has a second
/// `<testcase>` of the same name for the error: the two are one failure.
fn parse_junit(xml: &str) -> Result<BTreeMap<String, Outcome>, String> {
    let mut outcomes: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut rest = xml;
    while let Some(element) = next_element(rest, "testcase")? {
        let classname = element.attribute("classname")?;
        let name = element.attribute("name")?;
        let mut failure = None;
        for kind in ["failure", "error"] {
            if let Some(child) = next_element(element.content, kind)? {
                let message = child.attribute("message").unwrap_or_default();
                failure = Some(format!(
                    "{kind}: {message}\n{}",
                    decode_entities(child.content)
                ));
                break;
            }
        }
        let outcome = match failure {
            Some(report) => Outcome::Failed(report),
            None if next_element(element.content, "skipped")?.is_some() => Outcome::Skipped,
            None => Outcome::Passed,
        };
        let id = format!("{classname}::{name}");
        let merged = match (outcomes.remove(&id), outcome) {
            (Some(Outcome::Failed(first)), Outcome::Failed(then)) => {
                Outcome::Failed(format!("{first}\n{then}"))
            }
            (Some(failed @ Outcome::Failed(_)), _) | (_, failed @ Outcome::Failed(_)) => failed,
            (_, outcome) => outcome,
        };
        outcomes.insert(id, merged);
        rest = element.after;
    }
    if outcomes.is_empty() {
        return Err("no <testcase> in it".into());
    }
    Ok(outcomes)
}

/// One element of an XML text: its attributes as written (undecoded), its
/// content (empty if self-closing) and the text after it.
#[derive(Debug)]
struct Element<'a> {
    attributes: Vec<(&'a str, &'a str)>,
    content: &'a str,
    after: &'a str,
}

impl Element<'_> {
    /// The decoded value of the attribute `name`.
    fn attribute(&self, name: &str) -> Result<String, String> {
        self.attributes
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| decode_entities(value))
            .ok_or_else(|| format!("an element without the attribute {name}"))
    }
}

/// The first element named `name` in `text`, if there is one. Elements of
/// the same name are not nested in a JUnit report, and `<` stands for
/// itself nowhere in XML but at a tag, so the content of a non-empty
/// element ends at the first `</name>` after its start tag.
fn next_element<'a>(text: &'a str, name: &str) -> Result<Option<Element<'a>>, String> {
    let opening = format!("<{name}");
    let mut search = 0;
    let start = loop {
        let Some(found) = text[search..].find(&opening) else {
            return Ok(None);
        };
        let at = search + found + opening.len();
        // `<testcase` is not `<testcases`.
        match text[at..].chars().next() {
            Some(c) if c.is_ascii_whitespace() || c == '>' || c == '/' => break at,
            _ => search = at,
        }
    };
    let mut attributes = Vec::new();
    let mut rest = &text[start..];
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("/>") {
            return Ok(Some(Element {
                attributes,
                content: "",
                after,
            }));
        }
        if let Some(inside) = rest.strip_prefix('>') {
            let closing = format!("</{name}>");
            let end = inside
                .find(&closing)
                .ok_or_else(|| format!("<{name}> is not closed"))?;
            return Ok(Some(Element {
                attributes,
                content: &inside[..end],
                after: &inside[end + closing.len()..],
            }));
        }
        let equals = rest
            .find('=')
            .ok_or_else(|| format!("<{name}: an attribute without a value"))?;
        let key = rest[..equals].trim();
        let value_start = rest[equals + 1..].trim_start();
        let quote = value_start
            .chars()
            .next()
            .filter(|c| *c == '"' || *c == '\'')
            .ok_or_else(|| format!("<{name}: the attribute {key} is not quoted"))?;
        let value_end = value_start[1..]
            .find(quote)
            .ok_or_else(|| format!("<{name}: the attribute {key} is not closed"))?;
        attributes.push((key, &value_start[1..=value_end]));
        rest = &value_start[value_end + 2..];
    }
}

/// `text` with XML's character references and predefined entities
/// replaced by the characters they stand for (an unknown one is kept).
fn decode_entities(text: &str) -> String {
    let mut decoded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        decoded.push_str(&rest[..at]);
        rest = &rest[at..];
        let character = rest.find(';').and_then(|end| {
            let entity = &rest[1..end];
            let character = match entity {
                "lt" => Some('<'),
                "gt" => Some('>'),
                "amp" => Some('&'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                _ => entity
                    .strip_prefix("#x")
                    .or_else(|| entity.strip_prefix("#X"))
                    .map(|hex| u32::from_str_radix(hex, 16))
                    .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                    .and_then(Result::ok)
                    .and_then(char::from_u32),
            };
            character.map(|c| (c, end + 1))
        });
        match character {
            Some((c, length)) => {
                decoded.push(c);
                rest = &rest[length..];
            }
            None => {
                decoded.push('&');
                rest = &rest[1..];
            }
        }
    }
    decoded.push_str(rest);
    decoded
}

/// A failure's report shortened for a message: its first line (pytest's
/// message) and its last `lines` lines (where pytest puts the failing
/// assertion or the exception, after the test's source).
fn excerpt(report: &str, lines: usize) -> String {
    let all: Vec<&str> = report.lines().collect();
    if all.len() <= lines + 1 {
        return report.to_string();
    }
    format!("{}\n...\n{}", all[0], all[all.len() - lines..].join("\n"))
}

/// What is wrong when `oncekv`'s run is held to `etcd`'s: a test that
/// passes against etcd and not against oncekv without being listed in
/// `expected_to_differ`, a listed one that passes against oncekv now, or
/// a listed one that does not pass against etcd.
fn differences(
    etcd: &SuiteRun,
    oncekv: &SuiteRun,
    expected_to_differ: &[(&str, &str)],
) -> Vec<String> {
    let listed: BTreeMap<&str, &str> = expected_to_differ.iter().copied().collect();
    let mut problems = Vec::new();
    for (id, _) in etcd.outcomes.iter().filter(|(_, o)| **o == Outcome::Passed) {
        let against_oncekv = oncekv.outcomes.get(id);
        match (against_oncekv, listed.get(id.as_str())) {
            (Some(Outcome::Passed), None) => {}
            (Some(Outcome::Passed), Some(reason)) => problems.push(format!(
                "{id} passes against oncekv now: remove it from EXPECTED_TO_DIFFER (\"{reason}\")"
            )),
            (_, Some(_)) => {}
            (Some(Outcome::Failed(report)), None) => problems.push(format!(
                "{id} passes against etcd and fails against oncekv:\n{}",
                excerpt(report, 30)
            )),
            (Some(Outcome::Skipped), None) => {
                problems.push(format!(
                    "{id} passes against etcd and is skipped against oncekv"
                ));
            }
            (None, None) => {
                problems.push(format!(
                    "{id} passes against etcd and did not run against oncekv"
                ));
            }
        }
    }
    for (id, reason) in expected_to_differ {
        if etcd.outcomes.get(*id) != Some(&Outcome::Passed) {
            problems.push(format!(
                "{id} is listed in EXPECTED_TO_DIFFER (\"{reason}\") but does not pass against \
                 etcd ({:?}): the list names only tests that do",
                etcd.outcomes.get(*id)
            ));
        }
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aetcd_tests_that_pass_against_etcd_pass_against_oncekv() {
    let _one = exclusive().await;
    if let Some(missing) = missing_suite_part() {
        missing_dependency(TEST, Dependency::AetcdSuite, &missing);
        return;
    }
    if on_path("etcdctl").is_none() {
        missing_dependency(TEST, Dependency::Etcdctl, "no etcdctl binary on PATH");
        return;
    }
    let scratch = tempfile::tempdir().expect("temp dir");

    let Some(etcd) = EtcdProcess::start() else {
        missing_dependency(TEST, Dependency::Etcd, "no etcd binary on PATH");
        return;
    };
    answering(&etcd.endpoint).await;
    let against_etcd = run_suite("etcd", &etcd.endpoint, scratch.path(), &[]).await;
    drop(etcd);

    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(15)).await;
    let oncekv = cluster.node(1).client.clone();
    answering(&oncekv).await;
    let mut against_oncekv = run_suite("oncekv", &oncekv, scratch.path(), &[]).await;
    // Some of the suite's tests wait fixed times (for a watch event, a
    // lock's holder): on a loaded machine one can miss. A test that fails
    // against oncekv alone runs once more, and its second outcome counts.
    let again = unlisted_failures(&against_etcd, &against_oncekv, EXPECTED_TO_DIFFER);
    if !again.is_empty() {
        eprintln!("running again against oncekv: {}", again.join(", "));
        let second = run_suite("oncekv", &oncekv, scratch.path(), &again).await;
        for id in &again {
            if let Some(outcome) = second.outcomes.get(id) {
                against_oncekv.outcomes.insert(id.clone(), outcome.clone());
            }
        }
    }

    eprintln!("{}", against_etcd.summary("etcd"));
    eprintln!("{}", against_oncekv.summary("oncekv"));
    for (id, reason) in EXPECTED_TO_DIFFER {
        let against_oncekv = match against_oncekv.outcomes.get(*id) {
            Some(Outcome::Failed(report)) => report.lines().next().unwrap_or_default(),
            Some(Outcome::Passed) => "passed",
            Some(Outcome::Skipped) => "skipped",
            None => "did not run",
        };
        eprintln!("expected to differ: {id}: {reason}\n    against oncekv: {against_oncekv}");
    }
    let (passing_on_etcd, _, _) = against_etcd.counts();
    assert!(
        passing_on_etcd >= AT_LEAST_PASSING_ON_ETCD,
        "only {passing_on_etcd} aetcd tests pass against etcd (at least \
         {AT_LEAST_PASSING_ON_ETCD} should): the suite or its environment is broken; \
         failures:\n{}",
        against_etcd
            .outcomes
            .iter()
            .filter_map(|(id, outcome)| match outcome {
                Outcome::Failed(report) => Some(format!(
                    "{id}: {}",
                    report.lines().next().unwrap_or_default()
                )),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    );
    let problems = differences(&against_etcd, &against_oncekv, EXPECTED_TO_DIFFER);
    assert!(
        problems.is_empty(),
        "aetcd against oncekv differs from aetcd against etcd:\n\n{}",
        problems.join("\n\n")
    );
}

#[test]
fn a_test_id_is_its_pytest_node() {
    assert_eq!(
        pytest_node("tests.integration.test_kv::test_compact"),
        "tests/integration/test_kv.py::test_compact"
    );
}

#[test]
fn a_junit_report_is_read_test_by_test() {
    let xml = r#"<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="4"><testcase classname="tests.integration.test_kv" name="test_get_key" time="0.1" /><testcase classname="tests.integration.test_kv" name="test_put[a&gt;b]" time="0.1"><failure message="assert b'x' == b'y'&#10;  at &quot;here&quot;">tests/integration/test_kv.py:3: in test_put
    assert a &lt; b &amp;&amp; c</failure></testcase><testcase classname="tests.integration.test_cluster" name="test_member_list" time="0.0"><skipped type="pytest.skip" message="ETCD cluster was not run">reason</skipped></testcase><testcase classname='tests.integration.test_lock' name='test_lock'><system-out>&lt;failure&gt; printed</system-out><error message="failed on teardown" /></testcase><testcase classname="tests.integration.test_watch" name="test_watch"><failure message="first">call</failure></testcase><testcase classname="tests.integration.test_watch" name="test_watch"><error message="then">teardown</error></testcase></testsuite></testsuites>"#;
    let outcomes = parse_junit(xml).expect("a readable report");
    assert_eq!(outcomes.len(), 5, "{outcomes:?}");
    assert_eq!(
        outcomes["tests.integration.test_kv::test_get_key"],
        Outcome::Passed
    );
    assert_eq!(
        outcomes["tests.integration.test_kv::test_put[a>b]"],
        Outcome::Failed(
            "failure: assert b'x' == b'y'\n  at \"here\"\ntests/integration/test_kv.py:3: in \
             test_put\n    assert a < b && c"
                .into()
        )
    );
    assert_eq!(
        outcomes["tests.integration.test_cluster::test_member_list"],
        Outcome::Skipped
    );
    assert_eq!(
        outcomes["tests.integration.test_lock::test_lock"],
        Outcome::Failed("error: failed on teardown\n".into())
    );
    assert_eq!(
        outcomes["tests.integration.test_watch::test_watch"],
        Outcome::Failed("failure: first\ncall\nerror: then\nteardown".into())
    );
    assert!(parse_junit("<testsuites></testsuites>").is_err());
    assert!(parse_junit("<testcase classname=\"a\" name=\"b\">").is_err());
}

#[test]
fn only_unlisted_failures_and_listed_passes_are_differences() {
    let run = |outcomes: &[(&str, Outcome)]| SuiteRun {
        outcomes: outcomes
            .iter()
            .map(|(id, outcome)| ((*id).to_string(), outcome.clone()))
            .collect(),
        closing_line: String::new(),
    };
    let failed = || Outcome::Failed("failure: no".into());
    let etcd = run(&[
        ("same", Outcome::Passed),
        ("listed", Outcome::Passed),
        ("fixed", Outcome::Passed),
        ("broken", Outcome::Passed),
        ("etcd only fails", failed()),
    ]);
    let oncekv = run(&[
        ("same", Outcome::Passed),
        ("listed", failed()),
        ("fixed", Outcome::Passed),
        ("broken", failed()),
        ("etcd only fails", failed()),
    ]);
    let problems = differences(
        &etcd,
        &oncekv,
        &[
            ("listed", "why"),
            ("fixed", "was why"),
            ("etcd only fails", "stale"),
        ],
    );
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].starts_with("broken passes against etcd and fails"),
        "{problems:#?}"
    );
    assert!(
        problems[1].starts_with("fixed passes against oncekv now"),
        "{problems:#?}"
    );
    assert!(
        problems[2].starts_with("etcd only fails is listed"),
        "{problems:#?}"
    );
}
