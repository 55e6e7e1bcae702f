//! `PubSub::kept`: a topic's history read without subscribing, as a
//! Centrifugo subscribe reply and history request read it.

use super::*;

#[test]
fn kept_answers_the_top_and_what_follows_a_position() {
    let pubsub = PubSub::builder()
        .history(History::new(3, Duration::from_secs(3600)))
        .history_for("plain:", History::default())
        .build();
    // A topic not there yet is made: its epoch is the one a subscribe joins.
    let empty = pubsub.kept("t", None).unwrap();
    assert_eq!(
        (empty.position.offset, empty.publications.len(), empty.whole),
        (0, 0, true)
    );
    let epoch = empty.position.epoch;
    for n in 1..=5 {
        pubsub.publish("t", Message::Text(&n.to_string()));
    }
    let offsets = |kept: &Kept| {
        kept.publications
            .iter()
            .map(|p| p.position().offset)
            .collect::<Vec<_>>()
    };
    let all = pubsub.kept("t", None).unwrap();
    assert_eq!(
        (all.position, offsets(&all), all.whole),
        (Position { epoch, offset: 5 }, vec![3, 4, 5], true)
    );
    assert_eq!(all.publications[0].payload(), b"3");
    let at = |offset| Some(Position { epoch, offset });
    let after = pubsub.kept("t", at(3)).unwrap();
    assert_eq!((offsets(&after), after.whole), (vec![4, 5], true));
    let caught_up = pubsub.kept("t", at(5)).unwrap();
    assert_eq!((offsets(&caught_up), caught_up.whole), (vec![], true));
    // Older than what is kept, ahead of the topic, another epoch: not whole.
    for position in [
        at(1),
        at(6),
        Some(Position {
            epoch: Epoch::from_u64(epoch.as_u64() ^ 1),
            offset: 5,
        }),
    ] {
        let kept = pubsub.kept("t", position).unwrap();
        assert_eq!(
            (offsets(&kept), kept.whole, kept.position.offset),
            (vec![], false, 5)
        );
    }
    // Without history and subscribers there is nothing to read.
    assert!(pubsub.kept("plain:t", None).is_none());
    assert!(pubsub.kept("", None).is_none());
}
