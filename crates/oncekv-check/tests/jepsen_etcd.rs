//! Validates the checker against the recorded Jepsen etcd histories: every
//! file with a verdict in `jepsen-etcd/EXPECTED.txt` must get that verdict,
//! within a per-history time bound.
//!
//! The corpus is `tests/data/jepsen-etcd/` (vendored with its licence and
//! origin), or the directory named by `ONCEKV_HISTORIES`. A missing corpus
//! fails the tests.

use oncekv_check::jepsen::parse_log_file;
use oncekv_check::{Bounds, SearchStats, Verdict, check_with_stats};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ENV_VAR: &str = "ONCEKV_HISTORIES";
const PER_HISTORY: Duration = Duration::from_secs(10);

/// The `jepsen-etcd` directory of the corpus; panics when it is absent.
fn corpus_dir() -> PathBuf {
    let root = match std::env::var_os(ENV_VAR) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data"),
    };
    // Accept the histories directory or its jepsen-etcd subdirectory.
    let dir = if root.join("EXPECTED.txt").is_file() {
        root.clone()
    } else {
        root.join("jepsen-etcd")
    };
    assert!(
        dir.join("EXPECTED.txt").is_file(),
        "the Jepsen etcd corpus was not found: expected {} to exist; \
         it ships in tests/data/jepsen-etcd, or set {ENV_VAR} to a histories directory",
        dir.join("EXPECTED.txt").display()
    );
    dir
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expected {
    Linearizable,
    NotLinearizable,
}

fn expected_verdicts(dir: &Path) -> Vec<(String, Expected)> {
    let path = dir.join("EXPECTED.txt");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    let mut expected = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(file), Some(verdict), None) = (fields.next(), fields.next(), fields.next())
        else {
            panic!("{}:{}: malformed line {line:?}", path.display(), number + 1);
        };
        let verdict = match verdict {
            "linearizable" => Expected::Linearizable,
            "not-linearizable" => Expected::NotLinearizable,
            other => panic!(
                "{}:{}: unknown verdict {other:?}",
                path.display(),
                number + 1
            ),
        };
        expected.push((file.to_owned(), verdict));
    }
    assert!(!expected.is_empty(), "{} lists no history", path.display());
    expected
}

struct Run {
    file: String,
    expected: Expected,
    verdict: Verdict,
    stats: SearchStats,
}

fn check_file(dir: &Path, file: &str, expected: Expected) -> Run {
    let history = parse_log_file(&dir.join(file)).unwrap_or_else(|err| panic!("{file}: {err}"));
    let bounds = Bounds {
        time_limit: PER_HISTORY,
        ..Bounds::default()
    };
    let (verdict, stats) = check_with_stats(&history, &bounds);
    Run {
        file: file.to_owned(),
        expected,
        verdict,
        stats,
    }
}

#[test]
fn every_history_gets_its_expected_verdict() {
    let dir = corpus_dir();
    let expected = expected_verdicts(&dir);
    let started = Instant::now();

    // Spread the files over the available cores.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut runs: Vec<Run> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let (dir, expected) = (&dir, &expected);
                scope.spawn(move || {
                    expected
                        .iter()
                        .skip(worker)
                        .step_by(workers)
                        .map(|(file, verdict)| check_file(dir, file, *verdict))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| panic!("a worker panicked"))
            })
            .collect()
    });
    runs.sort_by(|a, b| a.file.cmp(&b.file));

    let mut failures = Vec::new();
    for run in &runs {
        let matches = match run.expected {
            Expected::Linearizable => run.verdict.is_linearizable(),
            Expected::NotLinearizable => run.verdict.is_not_linearizable(),
        };
        if !matches {
            failures.push(format!(
                "{}: expected {:?}, got {} ({:?})",
                run.file, run.expected, run.verdict, run.stats
            ));
        }
    }

    let mut slowest: Vec<&Run> = runs.iter().collect();
    slowest.sort_by_key(|run| std::cmp::Reverse(run.stats.elapsed));
    eprintln!(
        "checked {} histories in {:?}; slowest:",
        runs.len(),
        started.elapsed()
    );
    for run in slowest.iter().take(5) {
        eprintln!(
            "  {} {:?}: {:?}, {} states",
            run.file, run.expected, run.stats.elapsed, run.stats.states
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} histories got the wrong verdict:\n{}",
        failures.len(),
        runs.len(),
        failures.join("\n")
    );
}

#[test]
fn every_log_in_the_corpus_parses() {
    let dir = corpus_dir();
    let expected = expected_verdicts(&dir);
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|err| panic!("listing {}: {err}", dir.display()));
    let mut logs = 0;
    for entry in entries {
        let path = entry
            .unwrap_or_else(|err| panic!("listing {}: {err}", dir.display()))
            .path();
        if path.extension().is_none_or(|ext| ext != "log") {
            continue;
        }
        logs += 1;
        let history = parse_log_file(&path).unwrap_or_else(|err| panic!("{err}"));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let listed = expected.iter().any(|(file, _)| Some(file) == name.as_ref());
        // A log without a verdict is one whose run recorded nothing.
        assert!(
            listed || history.is_empty(),
            "{} has operations but no verdict in EXPECTED.txt",
            path.display()
        );
    }
    assert!(
        logs >= expected.len(),
        "EXPECTED.txt lists {} files, the directory holds {logs} logs",
        expected.len()
    );
}

#[test]
fn tiny_budgets_give_unknown_never_a_wrong_verdict() {
    let dir = corpus_dir();
    let bounds = Bounds {
        max_states: 64,
        ..Bounds::default()
    };
    let mut undecided = 0;
    for (file, expected) in expected_verdicts(&dir) {
        let history = parse_log_file(&dir.join(&file)).unwrap_or_else(|err| panic!("{err}"));
        let (verdict, _) = check_with_stats(&history, &bounds);
        match (expected, &verdict) {
            (_, Verdict::Unknown { .. }) => undecided += 1,
            (Expected::Linearizable, Verdict::Linearizable)
            | (Expected::NotLinearizable, Verdict::NotLinearizable { .. }) => {}
            _ => panic!("{file}: expected {expected:?}, got {verdict}"),
        }
    }
    assert!(undecided > 0, "a 64-state budget decided every history");
}
