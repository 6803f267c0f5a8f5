//! What the load generator sends: the workloads, the operations they are
//! made of, and how each task draws keys and values (fixed sizes, a seeded
//! generator per task, the same on every target).

use clap::ValueEnum;

/// What each operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// PUT of a value to a random key.
    Put,
    /// Linearizable GET of a random key (a read-index round on the leader).
    Get,
    /// Serializable GET (answered by the replica that receives it; may be
    /// stale).
    GetSerializable,
    /// APPEND to a random key (on etcd: read, then a transaction that
    /// writes the longer value if the key's revision did not change,
    /// retried on conflict).
    Append,
    /// INCR of a random counter (on etcd: read-modify-write, as APPEND).
    Incr,
    /// Read-modify-write: a linearizable GET of a random key, then a
    /// compare-and-swap expecting the value read. A swap that lost the race
    /// to another writer counts as a completed operation and as a CAS
    /// conflict.
    Cas,
    /// Linearizable GETs and PUTs of random keys, mixed by --read-ratio.
    Mixed,
    /// A transfer between two accounts (two distinct random keys): one
    /// transaction of two INCRs, -1 and +1 (on etcd, which has no INCR: a
    /// read of both accounts, then a Txn guarded by both keys' mod
    /// revisions that writes both new balances, retried on conflict).
    Transfer,
    /// Watch delivery: --watchers watchers on one prefix, --concurrency
    /// writers putting keys under it at --rate writes/s in all; measures
    /// the latency from a write sent to its event seen by each watcher,
    /// and the events delivered per second (not a closed loop).
    Watch,
}

impl Workload {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Get => "get",
            Workload::GetSerializable => "get-serializable",
            Workload::Append => "append",
            Workload::Incr => "incr",
            Workload::Cas => "cas",
            Workload::Mixed => "mixed",
            Workload::Transfer => "transfer",
            Workload::Watch => "watch",
        }
    }

    /// The first byte of its keys: counters and appended values live apart
    /// from the keys PUT, GET, CAS and mixed share, so that one run's values
    /// do not break another's (INCR on text is refused).
    fn key_prefix(self) -> u8 {
        match self {
            Workload::Append => b'a',
            Workload::Incr => b'i',
            Workload::Transfer => b't',
            Workload::Watch => b'w',
            _ => b'k',
        }
    }
}

/// One operation, as every target understands it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Read `key`.
    Get {
        /// The key.
        key: Vec<u8>,
        /// Without a linearizability guarantee.
        serializable: bool,
    },
    /// Append `value` to `key`.
    Append {
        /// The key.
        key: Vec<u8>,
        /// The bytes appended.
        value: Vec<u8>,
    },
    /// Add one to the counter at `key`.
    Incr {
        /// The key.
        key: Vec<u8>,
    },
    /// Read `key`, then set it to `new` if it still holds what was read.
    Cas {
        /// The key.
        key: Vec<u8>,
        /// The value swapped in.
        new: Vec<u8>,
    },
    /// Move one unit from the counter at `from` to the counter at `to`
    /// (two distinct keys), atomically.
    Transfer {
        /// The account debited.
        from: Vec<u8>,
        /// The account credited.
        to: Vec<u8>,
    },
}

impl Op {
    /// A short name for per-kind counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Put { .. } => "put",
            Op::Get { .. } => "get",
            Op::Append { .. } => "append",
            Op::Incr { .. } => "incr",
            Op::Cas { .. } => "cas",
            Op::Transfer { .. } => "transfer",
        }
    }
}

/// How keys and values are drawn.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// The workload.
    pub workload: Workload,
    /// Distinct keys (drawn uniformly).
    pub keys: u64,
    /// Bytes per key.
    pub key_bytes: usize,
    /// Bytes per value written.
    pub value_bytes: usize,
    /// For `mixed`: the share of reads, 0..=1.
    pub read_ratio: f64,
}

/// Decimal digits of `n` (at least 1).
pub fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

impl Shape {
    /// The smallest key size that tells `keys` keys apart (a prefix byte
    /// and the key's number).
    pub fn key_bytes_needed(keys: u64) -> usize {
        1 + digits(keys.saturating_sub(1))
    }

    /// Key number `index`: the workload's prefix byte, then the number,
    /// zero-padded to `key_bytes`.
    pub fn key(&self, index: u64) -> Vec<u8> {
        let width = self.key_bytes.saturating_sub(1);
        let mut key = Vec::with_capacity(self.key_bytes);
        key.push(self.workload.key_prefix());
        key.extend_from_slice(format!("{index:0width$}").as_bytes());
        key
    }
}

impl Shape {
    /// Whether the workload reads keys it does not write first (`get`,
    /// `get-serializable`, `mixed`): then every key is written once before
    /// the run, so reads find values on every target (a read of a missing
    /// key is cheaper, and not what is measured).
    pub fn reads_seeded_keys(&self) -> bool {
        matches!(
            self.workload,
            Workload::Get | Workload::GetSerializable | Workload::Mixed
        )
    }

    /// The PUTs that seed task `task` of `tasks`'s share of the keys
    /// (every `tasks`-th key from `task`; none for a workload that does not
    /// read seeded keys), with values of the run's size.
    pub fn seed_ops(&self, task: usize, tasks: usize) -> Vec<Op> {
        if !self.reads_seeded_keys() {
            return Vec::new();
        }
        let (Ok(first), Ok(step)) = (u64::try_from(task), u64::try_from(tasks.max(1))) else {
            return Vec::new();
        };
        let mut value = vec![b'v'; self.value_bytes];
        let tag = b"seed.";
        let n = tag.len().min(value.len());
        value[..n].copy_from_slice(&tag[..n]);
        let mut ops = Vec::new();
        let mut index = first;
        while index < self.keys {
            ops.push(Op::Put {
                key: self.key(index),
                value: value.clone(),
            });
            index = match index.checked_add(step) {
                Some(next) => next,
                None => break,
            };
        }
        ops
    }
}

/// The operations of one task: a seeded generator (splitmix64), so a run
/// draws the same keys on every target.
#[derive(Debug)]
pub struct Generator {
    shape: Shape,
    task: usize,
    state: u64,
    written: u64,
}

impl Generator {
    /// The generator of task number `task`.
    pub fn new(shape: Shape, task: usize) -> Generator {
        Generator {
            shape,
            task,
            state: 0x9E37_79B9_7F4A_7C15 ^ (task as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
            written: 0,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn key(&mut self) -> Vec<u8> {
        let keys = self.shape.keys.max(1);
        let index = super::fill::next_index(keys).unwrap_or_else(|| self.next_u64() % keys);
        self.shape.key(index)
    }

    /// Two distinct keys (the same one only when there is a single key).
    fn two_keys(&mut self) -> (Vec<u8>, Vec<u8>) {
        let keys = self.shape.keys.max(1);
        let from = self.next_u64() % keys;
        let to = if keys == 1 {
            from
        } else {
            (from + 1 + self.next_u64() % (keys - 1)) % keys
        };
        (self.shape.key(from), self.shape.key(to))
    }

    /// A value of exactly `value_bytes` bytes that starts with the task and
    /// a counter (so values differ, as a CAS needs), padded with `v`.
    fn value(&mut self) -> Vec<u8> {
        self.written += 1;
        let mut value = vec![b'v'; self.shape.value_bytes];
        let tag = format!("{:x}.{:x}.", self.task, self.written);
        let n = tag.len().min(value.len());
        value[..n].copy_from_slice(&tag.as_bytes()[..n]);
        value
    }

    /// The next operation.
    pub fn next_op(&mut self) -> Op {
        match self.shape.workload {
            Workload::Put => Op::Put {
                key: self.key(),
                value: self.value(),
            },
            Workload::Get | Workload::GetSerializable => Op::Get {
                key: self.key(),
                serializable: self.shape.workload == Workload::GetSerializable,
            },
            Workload::Append => Op::Append {
                key: self.key(),
                value: self.value(),
            },
            Workload::Incr => Op::Incr { key: self.key() },
            Workload::Transfer => {
                let (from, to) = self.two_keys();
                Op::Transfer { from, to }
            }
            // The watch writers draw keys only and stamp their own values.
            Workload::Watch => Op::Put {
                key: self.key(),
                value: Vec::new(),
            },
            Workload::Cas => Op::Cas {
                key: self.key(),
                new: self.value(),
            },
            Workload::Mixed => {
                if self.unit() < self.shape.read_ratio {
                    Op::Get {
                        key: self.key(),
                        serializable: false,
                    }
                } else {
                    Op::Put {
                        key: self.key(),
                        value: self.value(),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(workload: Workload, read_ratio: f64) -> Shape {
        Shape {
            workload,
            keys: 1000,
            key_bytes: 8,
            value_bytes: 64,
            read_ratio,
        }
    }

    #[test]
    fn keys_and_values_have_the_sizes_asked_for() {
        let mut generator = Generator::new(shape(Workload::Put, 0.0), 3);
        for _ in 0..100 {
            let Op::Put { key, value } = generator.next_op() else {
                panic!("put expected");
            };
            assert_eq!(key.len(), 8);
            assert!(key.starts_with(b"k0000"), "{key:?}");
            assert_eq!(value.len(), 64);
            assert!(value.starts_with(b"3."), "{value:?}");
        }
        assert_eq!(shape(Workload::Incr, 0.0).key(7), b"i0000007");
        assert_eq!(Shape::key_bytes_needed(1000), 4);
        assert_eq!(Shape::key_bytes_needed(1001), 5);
        assert_eq!(Shape::key_bytes_needed(1), 2);
    }

    #[test]
    fn consecutive_values_differ_even_when_short() {
        let mut short = shape(Workload::Cas, 0.0);
        short.value_bytes = 4;
        let mut generator = Generator::new(short, 0);
        let a = generator.next_op();
        let b = generator.next_op();
        let (Op::Cas { new: a, .. }, Op::Cas { new: b, .. }) = (a, b) else {
            panic!("cas expected");
        };
        assert_eq!((a.len(), b.len()), (4, 4));
        assert_ne!(a, b);
    }

    #[test]
    fn a_transfer_moves_between_two_distinct_accounts() {
        let mut generator = Generator::new(shape(Workload::Transfer, 0.0), 2);
        for _ in 0..1000 {
            let Op::Transfer { from, to } = generator.next_op() else {
                panic!("transfer expected");
            };
            assert_ne!(from, to);
            assert!(from.starts_with(b"t") && to.starts_with(b"t"), "{from:?}");
        }
        let mut two = shape(Workload::Transfer, 0.0);
        two.keys = 2;
        let mut generator = Generator::new(two, 0);
        for _ in 0..100 {
            let Op::Transfer { from, to } = generator.next_op() else {
                panic!("transfer expected");
            };
            assert_ne!(from, to);
        }
    }

    #[test]
    fn mixed_follows_the_read_ratio() {
        let mut generator = Generator::new(shape(Workload::Mixed, 0.9), 1);
        let reads = (0..10_000)
            .filter(|_| matches!(generator.next_op(), Op::Get { .. }))
            .count();
        assert!((8_700..=9_300).contains(&reads), "{reads} reads of 10000");
        let mut writes_only = Generator::new(shape(Workload::Mixed, 0.0), 1);
        assert!((0..1000).all(|_| matches!(writes_only.next_op(), Op::Put { .. })));
        let mut reads_only = Generator::new(shape(Workload::Mixed, 1.0), 1);
        assert!((0..1000).all(|_| matches!(reads_only.next_op(), Op::Get { .. })));
    }

    #[test]
    fn tasks_draw_different_keys_but_each_draws_the_same_every_run() {
        let draw = |task| {
            let mut generator = Generator::new(shape(Workload::Get, 0.0), task);
            (0..20).map(|_| generator.next_op()).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn read_workloads_seed_every_key_once() {
        for workload in [Workload::Get, Workload::GetSerializable, Workload::Mixed] {
            let shape = shape(workload, 0.5);
            let mut seeded: Vec<Vec<u8>> = (0..7)
                .flat_map(|task| shape.seed_ops(task, 7))
                .map(|op| match op {
                    Op::Put { key, value } => {
                        assert_eq!(value.len(), shape.value_bytes);
                        key
                    }
                    other => panic!("a seed is a put: {other:?}"),
                })
                .collect();
            seeded.sort();
            let mut expected: Vec<Vec<u8>> = (0..shape.keys).map(|i| shape.key(i)).collect();
            expected.sort();
            assert_eq!(seeded, expected, "{workload:?}");
        }
        assert!(shape(Workload::Put, 0.0).seed_ops(0, 1).is_empty());
    }
}
