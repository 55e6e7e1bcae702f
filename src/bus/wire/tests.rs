use super::*;

#[test]
fn every_message_the_bus_sends_reads_back() {
    let recovery = Json.recovery("a:b", false).unwrap();
    let OwnedMessage::Text(recovery) = recovery else {
        panic!("text")
    };
    assert_eq!(
        recovery.parse(),
        Ok(Incoming::Recovery {
            topic: "a:b".into(),
            recovered: false
        })
    );
    let binary = r#"{"topic":"t","epoch":"00000000000000ff","offset":9,"data_b64":"AAEC"}"#;
    let Ok(Incoming::Delivery { position, data, .. }) = binary.parse() else {
        panic!("a delivery")
    };
    assert_eq!((position.epoch.as_u64(), position.offset), (0xff, 9));
    assert_eq!(data, Data::Binary(vec![0, 1, 2]));
    assert_eq!(
        refusal(true, "no").parse(),
        Ok(Incoming::Error("no".into()))
    );
    assert_eq!(
        r#"{"subscribed":"x"}"#.parse(),
        Ok(Incoming::Subscribed("x".into()))
    );
    assert_eq!(r#"{"authorized":true}"#.parse(), Ok(Incoming::Authorized));
    let Ok(Incoming::Since(since)) = r#"{"topic":"a:b","since":"0a:7"}"#.parse() else {
        panic!("a since")
    };
    assert_eq!((since.topic.as_str(), since.position.offset), ("a:b", 7));
}

#[test]
fn what_is_not_a_bus_message_is_an_error_not_a_panic() {
    for bad in [
        "",
        "[]",
        "3",
        "{",
        r#"{"topic":1}"#,
        r#"{"topic":"a"}"#,
        r#"{"topic":"a","epoch":"zz","offset":1,"data":""}"#,
        r#"{"topic":"a","epoch":"01","offset":-1,"data":""}"#,
        r#"{"topic":"a","epoch":"01","offset":1}"#,
        r#"{"topic":"a","epoch":"01","offset":1,"data":"x","data_b64":"AA=="}"#,
        r#"{"topic":"a","epoch":"01","offset":1,"data_b64":"!!"}"#,
        r#"{"topic":"a","since":"7"}"#,
    ] {
        assert!(bad.parse::<Incoming>().is_err(), "{bad}");
    }
}

#[test]
fn an_absent_position_is_empty_fields() {
    assert_eq!(position_fields(None), (String::new(), 0));
    let position: Position = "0a:3".parse().unwrap();
    assert_eq!(
        position_fields(Some(position)),
        ("000000000000000a".into(), 3)
    );
}
