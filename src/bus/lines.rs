//! One publication of an NDJSON batch (`POST /publish`), read and checked.

use base64::Engine as _;
use serde_json::Value;

use crate::pubsub::check_topic;

/// The longest `?key=` (or `"key"`) a publish takes.
pub(crate) const MAX_KEY_LEN: usize = 256;

/// The most publications one `POST /publish` takes.
pub(crate) const MAX_BATCH: usize = 10_000;

/// The most bad lines a batch may have and still be published (each is
/// answered with its error): more, and the whole body is refused.
pub(crate) const MAX_BAD_LINES: usize = 100;

/// One NDJSON publication.
pub(crate) struct Line {
    pub topic: String,
    pub data: super::Data,
    pub key: Option<String>,
}

/// One NDJSON line: `{"topic":..,"data":..[,"key":..]}` (or `"data_b64"`
/// for a binary payload); why not, in a few words.
pub(crate) fn read_line(line: &str) -> Result<Line, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    // (Indexing a value that is not an object to take from it would panic.)
    let Value::Object(mut fields) = value else {
        return Err("not a JSON object".into());
    };
    let mut take = |name: &str| fields.remove(name).unwrap_or_default();
    let topic = match take("topic") {
        Value::String(topic) => topic,
        _ => return Err("no \"topic\" string".into()),
    };
    check_topic(&topic).map_err(|why| why.to_string())?;
    let data = match (take("data"), take("data_b64")) {
        (Value::String(text), Value::Null) => super::Data::Text(text),
        (Value::Null, Value::String(encoded)) => super::Data::Binary(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| format!("data_b64: {e}"))?,
        ),
        _ => return Err("one of \"data\" (text) or \"data_b64\" (binary)".into()),
    };
    let key = match take("key") {
        Value::Null => None,
        Value::String(key) if key.len() <= MAX_KEY_LEN => Some(key),
        _ => return Err("\"key\" is a string of at most 256 bytes".into()),
    };
    Ok(Line { topic, data, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_publications_or_a_reason() {
        let line = read_line(r#"{"topic":"a","data":"x","key":"k"}"#).unwrap();
        assert_eq!((line.topic.as_str(), line.key.as_deref()), ("a", Some("k")));
        let line = read_line(r#"{"topic":"a","data_b64":"AAE="}"#).unwrap();
        assert_eq!(line.data, super::super::Data::Binary(vec![0, 1]));
        for (bad, why) in [
            ("[1]", "not a JSON object"),
            ("{", "not JSON"),
            (r#"{"data":"x"}"#, "no \"topic\""),
            (r#"{"topic":"","data":"x"}"#, "empty"),
            (r#"{"topic":"a"}"#, "one of"),
            (r#"{"topic":"a","data":"x","data_b64":"AA=="}"#, "one of"),
            (r#"{"topic":"a","data_b64":"!"}"#, "data_b64"),
        ] {
            let error = read_line(bad).err().unwrap();
            assert!(error.contains(why), "{bad}: {error}");
        }
        let long = format!(r#"{{"topic":"a","data":"x","key":"{}"}}"#, "k".repeat(257));
        assert!(read_line(&long).is_err());
    }
}
