//! `oncekv txn`: a transaction read from standard input, in etcdctl's
//! text format (compares, a blank line, the success operations, a blank
//! line, the failure operations), extended with oncekv's operations:
//!
//! ```text
//! value("acct/a") = "100"
//! mod("acct/a") > "5"
//! exists("acct/c") = "false"
//!
//! incr acct/a -30
//! incr acct/b 30
//!
//! get acct/a
//! ```
//!
//! A compare is `TARGET("KEY") OP "VALUE"` with TARGET one of `value`,
//! `version`, `create`, `mod`, `exists` (`VALUE` `true`/`false`), OP one
//! of `=`, `!=`, `<`, `>`; `TARGET("PREFIX*")` compares every key under
//! the prefix. An operation is `put KEY VALUE [--lease NAME]`, `get KEY`,
//! `del KEY`, `del --prefix PREFIX`, `scan PREFIX [LIMIT]`,
//! `append KEY VALUE`, `incr KEY [BY]`, `cas KEY EXPECTED NEW` or
//! `cas --absent KEY NEW`. Words are split as a shell would (quotes,
//! backslashes); `#` starts a comment line.

use anyhow::{Context as _, anyhow, bail};
use oncekv_client::{Compare, CompareOp, CompareTarget, KeyScope, Txn, TxnOp};

/// Parses a transaction in the text format above.
pub fn parse(text: &str) -> anyhow::Result<Txn> {
    let mut sections: Vec<Vec<(usize, &str)>> = vec![Vec::new()];
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            if sections.len() < 3 {
                sections.push(Vec::new());
            }
            continue;
        }
        if let Some(section) = sections.last_mut() {
            section.push((number + 1, line));
        }
    }
    sections.resize(3, Vec::new());
    let compare = sections[0]
        .iter()
        .map(|(number, line)| compare(line).with_context(|| format!("line {number}: {line}")))
        .collect::<anyhow::Result<_>>()?;
    let ops = |section: &[(usize, &str)]| {
        section
            .iter()
            .map(|(number, line)| op(line).with_context(|| format!("line {number}: {line}")))
            .collect::<anyhow::Result<Vec<_>>>()
    };
    Ok(Txn {
        compare,
        success: ops(&sections[1])?,
        failure: ops(&sections[2])?,
    })
}

fn compare(line: &str) -> anyhow::Result<Compare> {
    let (target, rest) = line
        .split_once('(')
        .ok_or_else(|| anyhow!("a compare is TARGET(\"KEY\") OP \"VALUE\""))?;
    let (key, rest) = rest
        .rsplit_once(')')
        .ok_or_else(|| anyhow!("missing ')' after the key"))?;
    let key = unquote(key.trim())?;
    let words = shlex::split(rest).ok_or_else(|| anyhow!("unbalanced quotes"))?;
    let [op, value] = words.as_slice() else {
        bail!("expected OP \"VALUE\" after the key, e.g. = \"1\"");
    };
    let op = match op.as_str() {
        "=" | "==" => CompareOp::Equal,
        "!=" => CompareOp::NotEqual,
        "<" => CompareOp::Less,
        ">" => CompareOp::Greater,
        other => bail!("unknown operator {other:?} (=, !=, < or >)"),
    };
    let number = || -> anyhow::Result<u64> {
        value
            .parse()
            .with_context(|| format!("{value:?} is not a revision or version number"))
    };
    let target = match target.trim() {
        "value" | "val" => CompareTarget::Value(value.clone().into_bytes()),
        "version" | "ver" => CompareTarget::Version(number()?),
        "create" | "create_revision" => CompareTarget::CreateRevision(number()?),
        "mod" | "mod_revision" => CompareTarget::ModRevision(number()?),
        "exists" => CompareTarget::Exists(match value.as_str() {
            "true" => true,
            "false" => false,
            other => bail!("exists compares with \"true\" or \"false\", not {other:?}"),
        }),
        other => bail!("unknown compare target {other:?} (value, version, create, mod, exists)"),
    };
    let (key, scope) = match key.strip_suffix('*') {
        Some(prefix) => (prefix.to_string(), KeyScope::Prefix),
        None => (key, KeyScope::Key),
    };
    Ok(Compare {
        key: key.into_bytes(),
        scope,
        target,
        op,
    })
}

fn unquote(word: &str) -> anyhow::Result<String> {
    let mut words = shlex::split(word).ok_or_else(|| anyhow!("unbalanced quotes in the key"))?;
    match words.len() {
        1 => Ok(words.remove(0)),
        _ => bail!("the key must be one word (quote it)"),
    }
}

fn op(line: &str) -> anyhow::Result<TxnOp> {
    let words = shlex::split(line).ok_or_else(|| anyhow!("unbalanced quotes"))?;
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let bytes = |s: &str| s.as_bytes().to_vec();
    Ok(match words.as_slice() {
        ["put", key, value] => TxnOp::put(*key, *value),
        ["put", key, value, "--lease", lease] => TxnOp::Put {
            key: bytes(key),
            value: bytes(value),
            lease: Some(lease.to_string()),
        },
        ["get", key] => TxnOp::get(*key),
        ["del", "--prefix", prefix] | ["del", prefix, "--prefix"] => TxnOp::DeletePrefix {
            prefix: bytes(prefix),
        },
        ["del", key] => TxnOp::delete(*key),
        ["scan", prefix] => TxnOp::Scan {
            prefix: bytes(prefix),
            limit: 0,
        },
        ["scan", prefix, limit] => TxnOp::Scan {
            prefix: bytes(prefix),
            limit: limit.parse().context("the scan limit is a number")?,
        },
        ["append", key, value] => TxnOp::Append {
            key: bytes(key),
            value: bytes(value),
        },
        ["incr", key] => TxnOp::incr(*key, 1),
        ["incr", key, by] => TxnOp::incr(*key, by.parse().context("BY is an integer")?),
        ["cas", "--absent", key, new] => TxnOp::Cas {
            key: bytes(key),
            expected: None,
            new: bytes(new),
        },
        ["cas", key, expected, new] => TxnOp::Cas {
            key: bytes(key),
            expected: Some(bytes(expected)),
            new: bytes(new),
        },
        _ => bail!(
            "unknown operation: expected put KEY VALUE [--lease NAME], get KEY, del KEY, \
             del --prefix PREFIX, scan PREFIX [LIMIT], append KEY VALUE, incr KEY [BY], \
             cas KEY EXPECTED NEW or cas --absent KEY NEW"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let txn = parse(
            "value(\"acct/a\") = \"100\"\nmod(\"acct/a\") > \"5\"\nexists(\"acct/c\") = \"false\"\n\
             \nincr acct/a -30\nincr acct/b 30\n\nget acct/a\n",
        )
        .expect("parses");
        assert_eq!(txn.compare.len(), 3);
        assert_eq!(
            txn.compare[1].target,
            CompareTarget::ModRevision(5),
            "{txn:?}"
        );
        assert_eq!(txn.compare[1].op, CompareOp::Greater);
        assert_eq!(
            txn.success,
            vec![TxnOp::incr("acct/a", -30), TxnOp::incr("acct/b", 30)]
        );
        assert_eq!(txn.failure, vec![TxnOp::get("acct/a")]);
    }

    #[test]
    fn quotes_prefixes_and_comments() {
        let txn = parse(
            "# move a key\nversion(\"dir/*\") = \"0\"\n\nput \"a key\" \"a value\" --lease l\n\
             del --prefix old/\ncas --absent k v\n",
        )
        .expect("parses");
        assert_eq!(txn.compare[0].scope, KeyScope::Prefix);
        assert_eq!(txn.compare[0].key, b"dir/".to_vec());
        assert_eq!(
            txn.success[0],
            TxnOp::Put {
                key: b"a key".to_vec(),
                value: b"a value".to_vec(),
                lease: Some("l".into())
            }
        );
        assert!(matches!(txn.success[1], TxnOp::DeletePrefix { .. }));
        assert!(txn.failure.is_empty());
    }

    #[test]
    fn mistakes_name_their_line() {
        for (text, says) in [
            ("bogus(\"k\") = \"1\"\n", "line 1"),
            ("value(\"k\") ~ \"1\"\n", "unknown operator"),
            ("\nfrobnicate k\n", "line 2"),
            ("\nincr k x\n", "BY is an integer"),
            ("version(\"k\") = \"x\"\n", "not a revision"),
        ] {
            let error = format!("{:#}", parse(text).expect_err(text));
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
