//! [`ExecuteBatchRequest`], the one `oncekv.v1` message written by hand
//! rather than generated (`build.rs` maps `.oncekv.v1.ExecuteBatchRequest`
//! here with `extern_path`; [`crate::v1`] re-exports it). Its wire format
//! is what the `.proto` says, byte for byte; what differs is decoding: the
//! requests are counted as they are read, and the first one past
//! [`BATCH_REQUESTS_MAX`] fails the decoding at once, before it is decoded
//! and before anything after it is read. So a message of two million tiny
//! requests (4 MiB) costs the node its buffered bytes and 256 decoded
//! requests, never two million, and the refusal comes before the call's
//! handler (and so before its credentials are checked). The server answers
//! such a message INVALID_ARGUMENT, naming the cap.

use crate::BATCH_REQUESTS_MAX;
use crate::v1::ExecuteRequest;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, message, skip_field};

/// Many requests in one message (`ExecuteBatch`), at most
/// [`BATCH_REQUESTS_MAX`] of them: a message with more does not decode.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct ExecuteBatchRequest {
    /// The requests, in order.
    pub requests: Vec<ExecuteRequest>,
}

/// The field number of `requests`.
const REQUESTS: u32 = 1;

/// Why a batch message does not decode: it carries more requests than a
/// batch may.
pub fn too_many_requests() -> prost::DecodeError {
    // prost has no other public way to make a decoding error of one's own
    // (`Message` implementations are what it is for).
    #[allow(deprecated)]
    let mut error = prost::DecodeError::new(format!(
        "a batch holds at most {BATCH_REQUESTS_MAX} requests; this one holds more"
    ));
    error.push("ExecuteBatchRequest", "requests");
    error
}

impl prost::Message for ExecuteBatchRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        message::encode_repeated(REQUESTS, &self.requests, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            REQUESTS => {
                // Counted before the request is decoded: the one past the
                // cap is never built.
                if self.requests.len() >= BATCH_REQUESTS_MAX {
                    return Err(too_many_requests());
                }
                message::merge_repeated(wire_type, &mut self.requests, buf, ctx).map_err(
                    |mut error| {
                        error.push("ExecuteBatchRequest", "requests");
                        error
                    },
                )
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        message::encoded_len_repeated(REQUESTS, &self.requests)
    }

    fn clear(&mut self) {
        self.requests.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Command, Put, command};
    use prost::Message as _;

    /// What prost would generate from the `.proto` for the message: the
    /// reference for the wire format.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(message, repeated, tag = "1")]
        requests: Vec<ExecuteRequest>,
    }

    fn put(i: usize) -> ExecuteRequest {
        ExecuteRequest {
            origin: None,
            command: Some(Command {
                kind: Some(command::Kind::Put(Put {
                    key: format!("k{i}").into_bytes(),
                    value: vec![7; i % 5],
                    lease: None,
                })),
            }),
        }
    }

    /// `count` empty requests (two bytes each on the wire), encoded as the
    /// generated type would.
    fn empty_requests(count: usize) -> Vec<u8> {
        [0x0a, 0x00].repeat(count)
    }

    #[test]
    fn the_wire_format_is_the_generated_one() {
        for count in [0, 1, 7, BATCH_REQUESTS_MAX] {
            let requests: Vec<_> = (0..count).map(put).collect();
            let ours = ExecuteBatchRequest {
                requests: requests.clone(),
            };
            let theirs = Generated { requests };
            assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec(), "{count}");
            assert_eq!(ours.encoded_len(), theirs.encoded_len(), "{count}");
            let decoded =
                ExecuteBatchRequest::decode(&theirs.encode_to_vec()[..]).expect("decodes");
            assert_eq!(decoded, ours, "{count}");
        }
    }

    #[test]
    fn unknown_fields_are_skipped() {
        let mut bytes = Generated {
            requests: vec![put(1)],
        }
        .encode_to_vec();
        // Field 2, a varint; field 3, length-delimited.
        bytes.extend([0x10, 0x05, 0x1a, 0x02, 0xff, 0xff]);
        let decoded = ExecuteBatchRequest::decode(&bytes[..]).expect("decodes");
        assert_eq!(decoded.requests, vec![put(1)]);
    }

    #[test]
    fn the_cap_decodes_and_one_more_is_refused_naming_the_cap() {
        let at_cap = empty_requests(BATCH_REQUESTS_MAX);
        let decoded = ExecuteBatchRequest::decode(&at_cap[..]).expect("the cap decodes");
        assert_eq!(decoded.requests.len(), BATCH_REQUESTS_MAX);

        let over = empty_requests(BATCH_REQUESTS_MAX + 1);
        let error = ExecuteBatchRequest::decode(&over[..]).expect_err("one too many");
        let text = error.to_string();
        assert!(
            text.contains(&format!("at most {BATCH_REQUESTS_MAX} requests")),
            "{text}"
        );
        assert!(text.contains("ExecuteBatchRequest.requests"), "{text}");
    }

    #[test]
    fn decoding_stops_at_the_request_past_the_cap() {
        // 256 requests, then a 257th that is not even well-formed, then
        // two million more: the refusal is the count's, so nothing after
        // the cap was read, let alone decoded.
        let mut bytes = empty_requests(BATCH_REQUESTS_MAX);
        bytes.extend([0x0a, 0x7f, 0x01]);
        bytes.extend(empty_requests(2_000_000));
        let error = ExecuteBatchRequest::decode(&bytes[..]).expect_err("refused");
        assert_eq!(error, too_many_requests());

        // Below the cap, a broken request is refused as broken, where it
        // is.
        let mut bytes = empty_requests(3);
        bytes.extend([0x0a, 0x7f, 0x01]);
        let error = ExecuteBatchRequest::decode(&bytes[..]).expect_err("broken");
        assert_ne!(error, too_many_requests());
        assert!(
            error.to_string().contains("ExecuteBatchRequest.requests"),
            "{error}"
        );
    }

    #[test]
    fn requests_after_other_fields_are_counted_too() {
        // Interleaved unknown fields do not reset the count.
        let mut bytes = Vec::new();
        for _ in 0..=BATCH_REQUESTS_MAX {
            bytes.extend([0x10, 0x01, 0x0a, 0x00]);
        }
        let error = ExecuteBatchRequest::decode(&bytes[..]).expect_err("refused");
        assert_eq!(error, too_many_requests());
    }

    #[test]
    fn merging_counts_what_is_already_there() {
        let mut batch = ExecuteBatchRequest {
            requests: vec![ExecuteRequest::default(); BATCH_REQUESTS_MAX],
        };
        let error = batch
            .merge(&empty_requests(1)[..])
            .expect_err("the merge passes the cap");
        assert_eq!(error, too_many_requests());
        batch.clear();
        assert!(batch.requests.is_empty());
    }
}
