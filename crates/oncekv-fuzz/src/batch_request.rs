//! Target `batch_request`: the decoding of `ExecuteBatchRequest`
//! (`oncekv_proto::batch`), the one `oncekv.v1` message decoded by hand,
//! checked against the decoding prost generates for the same message
//! ([`GeneratedBatch`]: `repeated ExecuteRequest requests = 1;`).
//!
//! Input: the message bytes, whole.
//!
//! Checked:
//!
//! - neither decoding panics;
//! - up to the cap they agree: when the message holds at most
//!   [`BATCH_REQUESTS_MAX`] requests, both accept it with the same
//!   requests or both refuse it;
//! - past the cap the hand-written one refuses, with
//!   [`too_many_requests`], exactly when the requests before the one past
//!   the cap decode (the generated decoding of the bytes before that
//!   request's key accepts them); and it has read nothing past that key
//!   when it refuses: the count is checked as it decodes;
//! - it never refuses with the cap's error what holds no request past the
//!   cap, nor accepts what the generated decoding refuses;
//! - what it accepts encodes to the generated encoding, byte for byte, of
//!   the encoded length it reports, and decodes again to the same batch;
//! - merging the bytes into a batch that already holds requests counts
//!   them: up to the cap in all it merges, one more is refused.
//!
//! The fields of the message are walked with prost's own `decode_key` and
//! `skip_field` to find the key of the request past the cap.

use oncekv_proto::BATCH_REQUESTS_MAX;
use oncekv_proto::batch::too_many_requests;
use oncekv_proto::v1::{ExecuteBatchRequest, ExecuteRequest};
use prost::Message;
use prost::bytes::Buf;
use prost::encoding::{DecodeContext, decode_key, skip_field};

/// The field number of `requests`.
const REQUESTS: u32 = 1;

/// `ExecuteBatchRequest` as prost generates it from the `.proto`: the
/// reference for its wire format, without a cap.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GeneratedBatch {
    /// The requests, in order.
    #[prost(message, repeated, tag = "1")]
    pub requests: Vec<ExecuteRequest>,
}

/// Runs one input; panics when a property breaks.
pub fn batch_request(data: &[u8]) {
    decoded_requests(data);
}

/// Runs one input and returns how many requests the hand-written decoding
/// accepted (`None`: it refused the bytes); panics when a property breaks.
pub fn decoded_requests(data: &[u8]) -> Option<usize> {
    let mut counted = Counted::new(data);
    let ours = ExecuteBatchRequest::decode(&mut counted);
    let read = counted.read;
    let theirs = GeneratedBatch::decode(data);
    match past_the_cap(data) {
        Some(key) => check_past_the_cap(data, key, &ours, &theirs, read),
        None => check_within_the_cap(&ours, &theirs),
    }
    let batch = ours.ok()?;
    check_encoding(&batch);
    check_merge_counts(data, batch.requests.len());
    Some(batch.requests.len())
}

/// Where the key of the request past the cap lies: its first byte and
/// the byte after it.
#[derive(Clone, Copy, Debug)]
struct KeyAt {
    start: usize,
    end: usize,
}

/// The key of the first `requests` field past [`BATCH_REQUESTS_MAX`] of
/// them, if the fields up to it are well framed (their contents are not
/// decoded).
fn past_the_cap(data: &[u8]) -> Option<KeyAt> {
    let mut rest = data;
    let mut requests = 0usize;
    while !rest.is_empty() {
        let start = data.len() - rest.len();
        let (tag, wire_type) = decode_key(&mut rest).ok()?;
        if tag == REQUESTS {
            if requests == BATCH_REQUESTS_MAX {
                let end = data.len() - rest.len();
                return Some(KeyAt { start, end });
            }
            requests += 1;
        }
        skip_field(wire_type, tag, &mut rest, DecodeContext::default()).ok()?;
    }
    None
}

fn check_past_the_cap(
    data: &[u8],
    key: KeyAt,
    ours: &Result<ExecuteBatchRequest, prost::DecodeError>,
    theirs: &Result<GeneratedBatch, prost::DecodeError>,
    read: usize,
) {
    let before = GeneratedBatch::decode(&data[..key.start]);
    match (&before, ours) {
        (Ok(before), Err(refusal)) if *refusal == too_many_requests() => {
            assert_eq!(
                before.requests.len(),
                BATCH_REQUESTS_MAX,
                "the bytes before the request past the cap hold another count"
            );
            assert!(
                read <= key.end,
                "refused at the cap after reading {read} bytes; the key of the request past \
                 the cap ends at byte {}",
                key.end
            );
        }
        (Ok(_), other) => panic!(
            "{} requests decode and another follows, but the hand-written decoding answers \
             {other:?}",
            BATCH_REQUESTS_MAX
        ),
        (Err(broken), Ok(batch)) => panic!(
            "the requests before the cap do not decode ({broken}), yet the hand-written \
             decoding accepts {} requests",
            batch.requests.len()
        ),
        (Err(broken), Err(refusal)) => assert_ne!(
            *refusal,
            too_many_requests(),
            "refused for the cap where a request before it is broken ({broken})"
        ),
    }
    if let Ok(theirs) = theirs {
        assert!(
            theirs.requests.len() > BATCH_REQUESTS_MAX,
            "a request past the cap was found, but the generated decoding holds {}",
            theirs.requests.len()
        );
        assert!(ours.is_err(), "a batch over the cap was accepted");
    }
}

fn check_within_the_cap(
    ours: &Result<ExecuteBatchRequest, prost::DecodeError>,
    theirs: &Result<GeneratedBatch, prost::DecodeError>,
) {
    match (ours, theirs) {
        (Ok(ours), Ok(theirs)) => {
            assert!(
                ours.requests == theirs.requests,
                "the two decodings of one message differ"
            );
            assert!(ours.requests.len() <= BATCH_REQUESTS_MAX);
        }
        (Err(refusal), Err(_)) => assert_ne!(
            *refusal,
            too_many_requests(),
            "refused for the cap without a request past it"
        ),
        (Ok(ours), Err(error)) => panic!(
            "the hand-written decoding accepts {} requests the generated one refuses: {error}",
            ours.requests.len()
        ),
        (Err(refusal), Ok(theirs)) => panic!(
            "the hand-written decoding refuses ({refusal}) {} requests the generated one \
             accepts",
            theirs.requests.len()
        ),
    }
}

/// An accepted batch encodes as the generated type does, and back.
fn check_encoding(batch: &ExecuteBatchRequest) {
    let bytes = batch.encode_to_vec();
    assert_eq!(
        batch.encoded_len(),
        bytes.len(),
        "encoded_len is not the length"
    );
    let generated = GeneratedBatch {
        requests: batch.requests.clone(),
    };
    assert!(
        generated.encode_to_vec() == bytes,
        "the encoding differs from the generated one"
    );
    let again = ExecuteBatchRequest::decode(bytes.as_slice())
        .unwrap_or_else(|e| panic!("an encoded batch does not decode: {e}"));
    assert!(again == *batch, "encoding and decoding changed the batch");
}

/// Merging counts the requests already held: with room for exactly what
/// the bytes hold it merges, with one request less it is refused.
fn check_merge_counts(data: &[u8], count: usize) {
    let room = BATCH_REQUESTS_MAX - count;
    let mut fits = held(room);
    fits.merge(data)
        .unwrap_or_else(|e| panic!("{count} requests do not merge into a batch of {room}: {e}"));
    assert_eq!(fits.requests.len(), BATCH_REQUESTS_MAX);
    if count > 0 {
        let mut over = held(room + 1);
        let refused = over.merge(data);
        assert!(
            refused.as_ref().err() == Some(&too_many_requests()),
            "{count} requests merged into a batch of {}: {refused:?}",
            room + 1
        );
    }
}

/// A batch of `count` empty requests.
fn held(count: usize) -> ExecuteBatchRequest {
    ExecuteBatchRequest {
        requests: vec![ExecuteRequest::default(); count],
    }
}

/// Bytes to decode, counting how many were consumed.
struct Counted<'a> {
    data: &'a [u8],
    read: usize,
}

impl<'a> Counted<'a> {
    fn new(data: &'a [u8]) -> Counted<'a> {
        Counted { data, read: 0 }
    }
}

impl Buf for Counted<'_> {
    fn remaining(&self) -> usize {
        self.data.len() - self.read
    }

    fn chunk(&self) -> &[u8] {
        &self.data[self.read..]
    }

    fn advance(&mut self, count: usize) {
        // As slices do: advancing past the end is the caller's bug.
        assert!(count <= self.remaining(), "advanced past the end");
        self.read += count;
    }
}
