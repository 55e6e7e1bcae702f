use super::*;
use crate::proto::OpCode;
use crate::pubsub::history::{Epoch, Position};
use std::time::Duration;

fn publication(epoch: Epoch, offset: u64, at: Instant) -> Arc<Publication> {
    Arc::new(Publication::new(
        Arc::from("t"),
        Position { epoch, offset },
        None,
        OpCode::Text,
        format!("{offset}").as_bytes(),
        at,
    ))
}

fn unbounded() -> Arc<Histories> {
    Arc::new(Histories::new(usize::MAX))
}

fn offsets(since: Since<'_>) -> Option<Vec<u64>> {
    match since {
        Since::All(entries) => Some(entries.map(|p| p.position().offset).collect()),
        Since::Gap => None,
    }
}

#[test]
fn keeps_the_last_n_and_finds_what_follows_a_position() {
    let (epoch, now) = (Epoch::new(), Instant::now());
    let mut log = Log::new(History::new(3, Duration::from_secs(60)), unbounded());
    assert_eq!(offsets(log.since(0, 0)), Some(vec![]));
    for offset in 1..=5 {
        log.push(publication(epoch, offset, now), now);
    }
    // 3, 4, 5 kept.
    assert_eq!(offsets(log.since(5, 5)), Some(vec![]));
    assert_eq!(offsets(log.since(4, 5)), Some(vec![5]));
    assert_eq!(offsets(log.since(2, 5)), Some(vec![3, 4, 5]));
    assert_eq!(offsets(log.since(1, 5)), None, "2 is gone");
    assert_eq!(offsets(log.since(0, 5)), None);
    assert_eq!(log.latest().unwrap().position().offset, 5);
}

#[test]
fn lets_old_publications_go() {
    let (epoch, start) = (Epoch::new(), Instant::now());
    let mut log = Log::new(History::new(100, Duration::from_secs(10)), unbounded());
    log.push(publication(epoch, 1, start), start);
    let later = start + Duration::from_secs(5);
    log.push(publication(epoch, 2, later), later);
    log.expire(start + Duration::from_secs(12));
    assert_eq!(offsets(log.since(1, 2)), Some(vec![2]));
    assert_eq!(offsets(log.since(0, 2)), None);
    log.expire(start + Duration::from_secs(16));
    assert!(log.is_empty());
    // Nothing kept: only the latest position resumes.
    assert_eq!(offsets(log.since(2, 2)), Some(vec![]));
    assert_eq!(offsets(log.since(1, 2)), None);
}

#[test]
fn what_is_kept_is_counted_until_it_goes() {
    let (epoch, now) = (Epoch::new(), Instant::now());
    let histories = unbounded();
    let mut log = Log::new(History::new(2, Duration::from_secs(60)), histories.clone());
    let first = publication(epoch, 1, now);
    let one = KEPT_OVERHEAD + first.held_bytes();
    log.push(first, now);
    assert_eq!((histories.kept(), histories.bytes()), (1, one));
    for offset in 2..=4 {
        log.push(publication(epoch, offset, now), now);
    }
    // Two kept, each counted once.
    assert_eq!(histories.kept(), 2);
    assert_eq!(histories.bytes(), 2 * one);
    log.expire(now + Duration::from_secs(61));
    assert_eq!((histories.kept(), histories.bytes()), (0, 0));
    log.push(publication(epoch, 5, now), now);
    drop(log);
    assert_eq!(
        (histories.kept(), histories.bytes()),
        (0, 0),
        "given back on drop"
    );
}

#[test]
fn frames_made_later_count_once_recounted() {
    use crate::pubsub::Envelope;
    struct Loud;
    impl Envelope for Loud {
        fn wrap(&self, p: &Publication) -> crate::OwnedMessage {
            crate::OwnedMessage::Text("x".repeat(1000 + p.payload().len()))
        }
    }
    let (epoch, now) = (Epoch::new(), Instant::now());
    let histories = unbounded();
    let mut log = Log::new(History::new(10, Duration::from_secs(60)), histories.clone());
    let kept = publication(epoch, 1, now);
    log.push(kept.clone(), now);
    let before = histories.bytes();
    let envelope: Arc<dyn Envelope> = Arc::new(Loud);
    let _ = kept.frame(Some(&envelope));
    assert_eq!(histories.bytes(), before, "not counted until recounted");
    log.recount();
    assert!(
        histories.bytes() >= before + 1001,
        "{} then {}",
        before,
        histories.bytes()
    );
    drop(log);
    assert_eq!(histories.bytes(), 0);
}

#[test]
fn shedding_lets_go_of_the_oldest_through_the_one_named() {
    let (epoch, now) = (Epoch::new(), Instant::now());
    let histories = unbounded();
    let mut log = Log::new(History::new(10, Duration::from_secs(60)), histories.clone());
    let kept: Vec<_> = (1..=5)
        .map(|offset| publication(epoch, offset, now))
        .collect();
    for publication in &kept {
        log.push(publication.clone(), now);
    }
    assert_eq!(log.shed_through(&kept[2]), 3);
    assert_eq!(log.first(), Some(4));
    assert_eq!(log.shed_through(&kept[1]), 0, "gone already");
    let stranger = publication(epoch, 4, now);
    assert_eq!(
        log.shed_through(&stranger),
        0,
        "the same offset, not the same one"
    );
    assert_eq!(histories.kept(), 2);
}
