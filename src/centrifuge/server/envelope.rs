//! A publication as a Centrifugo publication push (with its publisher's
//! info when a client published it), once per format: the
//! pub/sub wraps each publication once for all the subscribers that share
//! an envelope, and replays the same frame.

use bytes::Bytes;

use super::info;
use crate::centrifuge::{Format, Publication as Pub, Push, PushBody, Reply, is_json};
use crate::proto::OwnedMessage;
use crate::pubsub::{Envelope, Publication};

/// The push for one format.
pub(super) struct Pushes(pub(super) Format);

impl Envelope for Pushes {
    fn wrap(&self, publication: &Publication) -> OwnedMessage {
        let push = Reply::push(Push {
            channel: publication.topic().to_owned(),
            body: PushBody::Pub(publication_of(self.0, publication)),
        });
        message(self.0, self.0.encode_one(&push))
    }
}

/// The protocol's publication for `publication`, with its publisher when
/// a client published it, its data fit for `format`: in JSON, a payload
/// that is not JSON (published by a Protobuf client) goes as a JSON string
/// of its text.
pub(super) fn publication_of(format: Format, publication: &Publication) -> Pub {
    let (info, payload) = match info::split(publication.payload()) {
        Some((who, data)) => (Some(info::fit(format, who)), data),
        None => (None, publication.payload()),
    };
    let data = if format == Format::Json && !is_json(payload) {
        let text = String::from_utf8_lossy(payload);
        Bytes::from(serde_json::Value::from(text.as_ref()).to_string())
    } else {
        Bytes::copy_from_slice(payload)
    };
    Pub {
        data,
        info,
        offset: publication.position().offset,
        ..Default::default()
    }
}

/// A frame's payload as the message `format` sends: text for JSON, binary
/// for Protobuf.
pub(super) fn message(format: Format, payload: Vec<u8>) -> OwnedMessage {
    match format {
        Format::Json => match String::from_utf8(payload) {
            Ok(text) => OwnedMessage::Text(text),
            Err(e) => OwnedMessage::Text(String::from_utf8_lossy(e.as_bytes()).into_owned()),
        },
        Format::Protobuf => OwnedMessage::Binary(Bytes::from(payload)),
    }
}
