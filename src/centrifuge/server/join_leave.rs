//! Join and leave pushes: when a client subscribes to a channel or leaves
//! it, every subscriber of the channel that asked for them (`join_leave`
//! in its subscribe) is told who (with the channel info its subscription
//! token gave it). The events travel as publications on a
//! companion topic of the same `PubSub` (so a Redis bridge carries them to
//! every node), in a form of their own that each format's envelope turns
//! into its push.

use super::envelope::message;
use super::info;
use crate::centrifuge::{ClientInfo, Format, Push, PushBody, Reply};
use crate::proto::OwnedMessage;
use crate::pubsub::{Envelope, Publication, check_topic};

/// The prefix of the topics join and leave events travel on: a channel's
/// events are on `JOIN_LEAVE_PREFIX` + the channel. No client may
/// subscribe, publish or read history under it. Give these topics no
/// history (`PubSub::builder().history_for(JOIN_LEAVE_PREFIX,
/// History::OFF)`): an event is for who is subscribed now.
pub const JOIN_LEAVE_PREFIX: &str = "\u{1}join_leave:";

/// Whether a client may name `channel`: a topic name the pub/sub takes,
/// not one of the join and leave topics.
pub(super) fn channel_ok(channel: &str) -> bool {
    check_topic(channel).is_ok() && !channel.starts_with(JOIN_LEAVE_PREFIX)
}

/// The topic `channel`'s events travel on, if its name leaves room.
pub(super) fn topic(channel: &str) -> Option<String> {
    let topic = format!("{JOIN_LEAVE_PREFIX}{channel}");
    check_topic(&topic).is_ok().then_some(topic)
}

/// Which event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Join,
    Leave,
}

/// An event as published: a byte for the kind, then who (`info::put`).
pub(super) fn encode(kind: Kind, who: &ClientInfo) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + info::len(who));
    out.push(match kind {
        Kind::Join => b'j',
        Kind::Leave => b'l',
    });
    info::put(&mut out, who);
    out
}

/// An event read back; `None` for anything `encode` did not write (an
/// event from a Redis that is not trusted).
pub(super) fn decode(bytes: &[u8]) -> Option<(Kind, ClientInfo)> {
    let (&kind, mut rest) = bytes.split_first()?;
    let kind = match kind {
        b'j' => Kind::Join,
        b'l' => Kind::Leave,
        _ => return None,
    };
    let who = info::take(&mut rest)?;
    rest.is_empty().then_some((kind, who))
}

/// The join or leave push for one format.
pub(super) struct Pushes(pub(super) Format);

impl Envelope for Pushes {
    fn wrap(&self, publication: &Publication) -> OwnedMessage {
        let channel = publication
            .topic()
            .strip_prefix(JOIN_LEAVE_PREFIX)
            .unwrap_or_default()
            .to_owned();
        // An event that does not read (not ours) becomes a leave of
        // nobody: an envelope must send something, and that one changes
        // no client's idea of who is there.
        let (kind, who) =
            decode(publication.payload()).unwrap_or((Kind::Leave, ClientInfo::default()));
        let who = info::fit(self.0, who);
        let body = match kind {
            Kind::Join => PushBody::Join(who),
            Kind::Leave => PushBody::Leave(who),
        };
        message(
            self.0,
            self.0.encode_one(&Reply::push(Push { channel, body })),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::centrifuge::server::info::tests::info;

    #[test]
    fn an_event_reads_back_as_written() {
        for kind in [Kind::Join, Kind::Leave] {
            assert_eq!(decode(&encode(kind, &info())), Some((kind, info())));
        }
        let anonymous = ClientInfo::default();
        assert_eq!(
            decode(&encode(Kind::Join, &anonymous)),
            Some((Kind::Join, anonymous))
        );
    }

    #[test]
    fn every_cut_and_every_changed_kind_is_refused() {
        let event = encode(Kind::Join, &info());
        for len in 0..event.len() {
            assert_eq!(decode(&event[..len]), None, "cut at {len}");
        }
        let mut longer = event.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None);
        let mut other = event.clone();
        other[0] = b'x';
        assert_eq!(decode(&other), None);
        // A length past the end.
        let mut lying = event;
        lying[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode(&lying), None);
    }

    #[test]
    fn only_names_with_room_have_a_topic_and_clients_cannot_name_one() {
        assert_eq!(topic("news").as_deref(), Some("\u{1}join_leave:news"));
        let longest = "x".repeat(crate::pubsub::MAX_TOPIC_LEN);
        assert!(channel_ok(&longest));
        assert_eq!(topic(&longest), None);
        assert!(!channel_ok(&topic("news").unwrap()));
        assert!(!channel_ok(""));
    }
}
