//! The subscribe URL's query: which topics, from where (`topics`,
//! `latest`, `since`), in which format (`positions`), with which token.

use crate::handshake::{percent_decode, percent_encode};
use crate::pubsub::{Position, Start, check_topic};

/// Topics one connection may hold: enough for any page, and a bound on
/// what one client can make the registry keep.
pub const MAX_TOPICS_PER_CONNECTION: usize = 256;

/// Where one subscriber resumes a topic: `since=<topic>:<epoch>:<offset>`
/// in the subscribe URL, the topic percent-encoded (it may hold colons
/// itself), the position as the deliveries carry it.
///
/// ```
/// use rapidws::bus::Since;
///
/// let since: Since = "news%3Aeu:00000000000000ab:7".parse().unwrap();
/// assert_eq!(since.topic, "news:eu");
/// assert_eq!(since.position.offset, 7);
/// assert_eq!(since.to_string(), "news%3Aeu:00000000000000ab:7");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Since {
    /// The topic, decoded.
    pub topic: String,
    /// The last position the subscriber was delivered.
    pub position: Position,
}

impl std::str::FromStr for Since {
    type Err = String;

    fn from_str(raw: &str) -> Result<Since, String> {
        let shape = "since is <topic>:<epoch>:<offset>, the epoch and offset from a delivery";
        let mut parts = raw.rsplitn(3, ':');
        let (Some(offset), Some(epoch), Some(topic)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(shape.into());
        };
        let topic =
            percent_decode(topic).ok_or("a topic in since is not valid percent-encoded UTF-8")?;
        check_topic(&topic).map_err(|why| format!("since: {why}"))?;
        let position: Position = format!("{epoch}:{offset}")
            .parse()
            .map_err(|why| format!("{shape}: {why}"))?;
        Ok(Since { topic, position })
    }
}

impl std::fmt::Display for Since {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", percent_encode(&self.topic), self.position)
    }
}

/// What a subscribe URL asks for, read and checked at the upgrade.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    /// `positions=1`: deliveries in the JSON envelope.
    pub positions: bool,
    /// `starts=1` (with `positions=1`): each topic subscribed from now is
    /// followed by where it starts.
    pub starts: bool,
    /// `token=`, decoded.
    pub token: Option<String>,
    /// Each topic once, with where it starts.
    pub topics: Vec<(String, Start)>,
}

/// Reads a subscribe URL's query (see the module docs of [`super`]): why
/// not in one line, for a 400.
pub(crate) fn read_query(query: &str) -> Result<Asked, String> {
    let positions = query_values(query, "positions").any(|v| v == "1");
    let starts = positions && query_values(query, "starts").any(|v| v == "1");
    let token = match query_values(query, "token").next() {
        None => None,
        Some(raw) => Some(percent_decode(raw).ok_or("the token is not valid percent-encoded")?),
    };
    let mut topics: Vec<(String, Start)> = Vec::new();
    let listed = query_values(query, "topics").next().unwrap_or("");
    for topic in topic_list("topics", listed)? {
        if !topics.iter().any(|(t, _)| *t == topic) {
            topics.push((topic, Start::Now));
        }
    }
    // `latest=a,b`: each starts with its latest kept publication ("cache"
    // mode; needs history).
    let latest = query_values(query, "latest").next().unwrap_or("");
    for topic in topic_list("latest", latest)? {
        match topics.iter_mut().find(|(t, _)| *t == topic) {
            Some((_, start)) => *start = Start::Latest,
            None => topics.push((topic, Start::Latest)),
        }
    }
    for raw in query_values(query, "since") {
        let since: Since = raw.parse()?;
        match topics.iter_mut().find(|(t, _)| *t == since.topic) {
            Some((_, start)) => *start = Start::After(since.position),
            None => topics.push((since.topic, Start::After(since.position))),
        }
        if topics.len() > MAX_TOPICS_PER_CONNECTION {
            break;
        }
    }
    if topics.len() > MAX_TOPICS_PER_CONNECTION {
        return Err(format!("more than {MAX_TOPICS_PER_CONNECTION} topics"));
    }
    Ok(Asked {
        positions,
        starts,
        token,
        topics,
    })
}

/// The values of `name` in a query string (`a=1&topics=x,y`), undecoded,
/// in order.
pub(crate) fn query_values<'q>(query: &'q str, name: &str) -> impl Iterator<Item = &'q str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(move |(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The topics of `topics=a,b` (or `latest=`), each decoded and checked:
/// an empty list is no topic, but an empty name in a list (`a,,b`, `a,`)
/// is refused as any empty topic name is, not skipped.
pub(crate) fn topic_list(param: &str, listed: &str) -> Result<Vec<String>, String> {
    if listed.is_empty() {
        return Ok(Vec::new());
    }
    let mut topics = Vec::new();
    for raw in listed.split(',') {
        if raw.is_empty() {
            return Err(format!(
                "an empty topic name in {param}= (two commas in a row, or one at an end)"
            ));
        }
        let topic = percent_decode(raw).ok_or("a topic is not valid percent-encoded UTF-8")?;
        check_topic(&topic).map_err(|why| why.to_string())?;
        topics.push(topic);
        if topics.len() > MAX_TOPICS_PER_CONNECTION {
            return Err(format!("more than {MAX_TOPICS_PER_CONNECTION} topics"));
        }
    }
    Ok(topics)
}

/// A topic for an error message: long ones cut.
pub(crate) fn shorten(topic: &str) -> String {
    match topic.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &topic[..at]),
        None => topic.to_owned(),
    }
}

#[cfg(test)]
#[path = "query/tests.rs"]
mod tests;
