use super::*;

#[test]
fn query_values_by_name() {
    let first = |query, name| query_values(query, name).next();
    assert_eq!(first("topics=a,b", "topics"), Some("a,b"));
    assert_eq!(first("x=1&topics=&y", "topics"), Some(""));
    assert_eq!(first("x=1", "topics"), None);
    let all: Vec<_> = query_values("since=a:1:2&x&since=b:3:4", "since").collect();
    assert_eq!(all, ["a:1:2", "b:3:4"]);
}

#[test]
fn an_empty_name_in_a_topic_list_is_refused() {
    assert_eq!(topic_list("topics", ""), Ok(vec![]));
    assert_eq!(
        topic_list("topics", "a,b%20c"),
        Ok(vec!["a".into(), "b c".into()])
    );
    for bad in ["a,,b", "a,", ",a", ","] {
        let why = topic_list("topics", bad).unwrap_err();
        assert!(why.contains("empty topic name in topics="), "{bad}: {why}");
    }
}

#[test]
fn since_names_a_topic_and_a_position() {
    let since: Since = "a%3Ab:00ff:7".parse().unwrap();
    assert_eq!((since.topic.as_str(), since.position.offset), ("a:b", 7));
    assert_eq!(since.position.epoch.as_u64(), 0xff);
    assert_eq!(since.to_string(), "a%3Ab:00000000000000ff:7");
    let since: Since = "x:y:ab:0".parse().unwrap();
    assert_eq!(since.topic, "x:y", "the topic may hold colons");
    for bad in ["a", "a:1", ":ab:1", "a:zz:1", "a:ab:-1", "a:ab:x"] {
        assert!(bad.parse::<Since>().is_err(), "{bad}");
    }
}

#[test]
fn a_query_reads_into_topics_and_starts() {
    let asked = read_query("topics=a,b&latest=b,c&since=a:01:5&positions=1").unwrap();
    assert!(asked.positions);
    let starts: Vec<_> = asked.topics.iter().map(|(t, s)| (t.as_str(), *s)).collect();
    let position = "01:5".parse().unwrap();
    assert_eq!(
        starts,
        [
            ("a", Start::After(position)),
            ("b", Start::Latest),
            ("c", Start::Latest)
        ]
    );
    assert!(read_query("topics=a,,b").is_err());
    assert!(read_query("since=a").is_err());
    assert!(read_query("token=%zz").is_err());
}

#[test]
fn too_many_topics_are_refused_early() {
    let many: Vec<String> = (0..300).map(|n| format!("t{n}")).collect();
    let why = read_query(&format!("topics={}", many.join(","))).unwrap_err();
    assert!(why.contains("more than 256"), "{why}");
    let sinces: Vec<String> = many.iter().map(|t| format!("since={t}:01:1")).collect();
    let why = read_query(&sinces.join("&")).unwrap_err();
    assert!(why.contains("more than 256"), "{why}");
}
