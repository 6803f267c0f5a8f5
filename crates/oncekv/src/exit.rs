//! The exit codes of every `oncekv` subcommand, in one table: a code means
//! the same thing whichever command returns it, and `oncekv --help` and the
//! README print this table.

use std::process::ExitCode;

/// Success: applied, replayed or found; a node stopped cleanly; a fault
/// run passed.
pub const OK: u8 = 0;
/// Another error (unreachable, invalid request, failed while running).
pub const ERROR: u8 = 1;
/// A usage error (bad flags or arguments).
pub const USAGE: u8 = 2;
/// A definite application-level "no" (CAS did not match, lease exists, key
/// absent).
pub const REJECTED: u8 = 3;
/// A session or sequence error (expired, stale, gap, wrong secret).
pub const SESSION: u8 = 4;
/// The outcome is unknown: the request may or may not have applied.
pub const UNKNOWN: u8 = 5;
/// Refused for now, not applied (a full table or budget, the NOSPACE
/// alarm, load shedding): retry later.
pub const OVERLOADED: u8 = 6;
/// `verify`: the checkers found a violation.
pub const VIOLATION: u8 = 7;
/// `verify`: the run was inconclusive (it exercised too little).
pub const INCONCLUSIVE: u8 = 8;
/// `verify`: the run could not be made.
pub const NOT_RUN: u8 = 9;
/// `serve`: the data directory is unusable (damaged log, another node's or
/// cluster's data).
pub const DATA_REFUSED: u8 = 10;
/// `serve`: an address cannot be bound (in use, or not local).
pub const ADDRESS: u8 = 11;
/// `serve`: storage failed while running (a log write or sync failed, or
/// the disk is full); the node stopped without acknowledging unsynced data.
pub const STORAGE: u8 = 12;
/// Not authenticated, or not permitted: the cluster enforces
/// authentication and the call named no valid user, or its user lacks the
/// permission (a key outside its grants, an admin call). Not applied.
pub const DENIED: u8 = 13;

/// The table, as `--help` and the README print it.
pub const TABLE: &str = "\
Exit codes (the same for every subcommand):
  0  success: applied or replayed (or found, for reads); a node stopped
     cleanly; a fault run passed
  1  other error (unreachable, invalid request, failed while running)
  2  usage error
  3  definite rejection (CAS did not match, lease exists, key absent, ...)
  4  session or sequence error (expired, stale, gap, unauthorized)
  5  outcome unknown: the request may or may not have applied
  6  overloaded: refused for now, not applied (a full table or budget, the
     NOSPACE alarm, load shedding); retry later
  7  verify: a violation was found
  8  verify: inconclusive (the run exercised too little)
  9  verify: the run could not be made
  10 serve: data directory unusable (damaged log, another node's data)
  11 serve: an address cannot be bound
  12 serve: storage failed (a log write or sync failed, or the disk is
     full); restart it (after freeing space) to recover
  13 denied: not authenticated, or the user lacks the permission; not
     applied";

/// The exit code `code`.
pub fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_every_code_once_in_order() {
        let codes = [
            OK,
            ERROR,
            USAGE,
            REJECTED,
            SESSION,
            UNKNOWN,
            OVERLOADED,
            VIOLATION,
            INCONCLUSIVE,
            NOT_RUN,
            DATA_REFUSED,
            ADDRESS,
            STORAGE,
            DENIED,
        ];
        let listed: Vec<u8> = TABLE
            .lines()
            .filter_map(|line| line.split_whitespace().next()?.parse().ok())
            .collect();
        assert_eq!(listed, codes);
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
                .expect("README");
        assert!(
            readme.contains(TABLE),
            "README.md must carry the exit code table exactly as `oncekv --help` prints it"
        );
    }
}
