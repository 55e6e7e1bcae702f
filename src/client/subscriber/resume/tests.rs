use super::*;
use crate::bus::Data;

fn delivery(topic: &str, position: &str) -> Incoming {
    Incoming::Delivery {
        topic: topic.into(),
        position: position.parse().unwrap(),
        data: Data::Text(format!("{topic}@{position}")),
    }
}

fn offsets(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|event| match event {
            Event::Delivery {
                topic, position, ..
            } => format!("{topic} {position}"),
            Event::Discontinuity { topic } => format!("# {topic}"),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn the_query_resumes_what_was_delivered() {
    let mut resume = Resume::new(["a:b".to_owned(), "c d".to_owned(), "a:b".to_owned()]);
    assert_eq!(resume.query(), "positions=1&starts=1&topics=a%3Ab,c%20d");
    resume.handle(delivery("a:b", "0f:3"));
    assert_eq!(
        resume.query(),
        "positions=1&starts=1&topics=c%20d&since=a%3Ab:000000000000000f:3"
    );
}

#[test]
fn a_position_is_delivered_once() {
    let mut resume = Resume::new(["a".to_owned()]);
    let mut seen = Vec::new();
    for position in ["01:1", "01:2", "01:1", "01:2", "01:3", "01:3"] {
        seen.extend(resume.handle(delivery("a", position)));
    }
    assert_eq!(
        offsets(&seen),
        [
            "a 0000000000000001:1",
            "a 0000000000000001:2",
            "a 0000000000000001:3"
        ]
    );
}

#[test]
fn a_new_epoch_is_a_discontinuity_told_once() {
    let mut resume = Resume::new(["a".to_owned()]);
    resume.handle(delivery("a", "01:5"));
    // Told by the server, then the new epoch: one discontinuity.
    let mut seen = resume.handle(Incoming::Recovery {
        topic: "a".into(),
        recovered: false,
    });
    seen.extend(resume.handle(delivery("a", "02:1")));
    assert_eq!(offsets(&seen), ["# a", "a 0000000000000002:1"]);
    // Not told: the client says so itself.
    let seen = resume.handle(delivery("a", "03:1"));
    assert_eq!(offsets(&seen), ["# a", "a 0000000000000003:1"]);
    // Recovered, unknown topics and acknowledgements tell nothing.
    for quiet in [
        Incoming::Recovery {
            topic: "a".into(),
            recovered: true,
        },
        Incoming::Subscribed("a".into()),
        delivery("z", "01:1"),
    ] {
        assert!(resume.handle(quiet).is_empty());
    }
}

#[test]
fn a_topic_without_deliveries_resumes_from_where_it_joined() {
    let mut resume = Resume::new(["a".to_owned(), "b".to_owned()]);
    let joined = |topic: &str, at: &str| {
        Incoming::Since(crate::bus::Since {
            topic: topic.into(),
            position: at.parse().unwrap(),
        })
    };
    assert!(resume.handle(joined("a", "0f:4")).is_empty());
    assert_eq!(
        resume.query(),
        "positions=1&starts=1&topics=b&since=a:000000000000000f:4"
    );
    // A later one never moves a topic back.
    resume.handle(delivery("a", "0f:6"));
    resume.handle(joined("a", "0f:5"));
    assert_eq!(
        resume.query(),
        "positions=1&starts=1&topics=b&since=a:000000000000000f:6"
    );
}
