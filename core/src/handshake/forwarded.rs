//! Who a request came from, as trusted proxies tell it: `Forwarded` (RFC
//! 7239), or else `X-Forwarded-For`, `-Proto` and `-Host`.
//!
//! Anyone can send these headers, so [`forwarded`] reads them only when
//! the connection's own peer is a trusted proxy, and then walks the chain
//! of addresses from its right end (the nearest proxy's own observation)
//! past every further trusted proxy: the first address that is not one is
//! the client's. What a client wrote to the left of that is never read, so
//! a client cannot pose as another by sending the header itself.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The most hops walked: a chain this long of trusted proxies is a loop or
/// a forgery.
pub const MAX_HOPS: usize = 32;

/// What trusted proxies say of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forwarded<'a> {
    /// The client's address, `None` when the proxy did not know it
    /// (`for=unknown`, or an obfuscated name).
    pub client: Option<IpAddr>,
    /// The client's port, if a proxy gave it (`Forwarded` only).
    pub port: Option<u16>,
    /// The scheme the client used (`http`, `https`), lowercase as sent.
    pub proto: Option<Cow<'a, str>>,
    /// The `Host` the client sent.
    pub host: Option<Cow<'a, str>>,
}

/// Why the headers did not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardedError {
    /// A `Forwarded` element, or a chain's entry, that does not parse.
    Malformed,
    /// More than [`MAX_HOPS`] trusted proxies in a row.
    TooManyHops,
}

impl ForwardedError {
    /// A short reason, for an HTTP error's text.
    pub fn reason(self) -> &'static str {
        match self {
            ForwardedError::Malformed => "malformed forwarding header from a trusted proxy",
            ForwardedError::TooManyHops => "too many proxies in a forwarding header",
        }
    }
}

impl std::fmt::Display for ForwardedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for ForwardedError {}

/// Reads the request's forwarding headers (`headers`: every header, name
/// and value, in order), if `peer` is trusted (`trusted`); `Ok(None)` if
/// it is not, or no forwarding header came. `Forwarded` wins over the
/// `X-Forwarded-*` headers when both came.
pub fn forwarded<'a, H>(
    peer: IpAddr,
    headers: H,
    trusted: impl Fn(IpAddr) -> bool,
) -> Result<Option<Forwarded<'a>>, ForwardedError>
where
    H: IntoIterator<Item = (&'a str, &'a [u8])> + Clone,
{
    if !trusted(peer) {
        return Ok(None);
    }
    let values = |name: &str| {
        let headers = headers.clone().into_iter();
        let name = name.to_owned();
        headers
            .filter(move |(n, _)| n.eq_ignore_ascii_case(&name))
            .map(|(_, v)| v)
    };
    if values("forwarded").next().is_some() {
        let mut elements = Vec::new();
        for value in values("forwarded") {
            let text = std::str::from_utf8(value).map_err(|_| ForwardedError::Malformed)?;
            split_list(text, &mut elements)?;
        }
        return from_elements(&elements, &trusted).map(Some);
    }
    if values("x-forwarded-for").next().is_none() {
        return Ok(None);
    }
    let mut chain = Vec::new();
    for value in values("x-forwarded-for") {
        let text = std::str::from_utf8(value).map_err(|_| ForwardedError::Malformed)?;
        split_list(text, &mut chain)?;
    }
    if chain.is_empty() {
        // Only empty items: nothing was said.
        return Ok(None);
    }
    let mut hop = None;
    for (walked, entry) in chain.iter().rev().enumerate() {
        if walked == MAX_HOPS {
            return Err(ForwardedError::TooManyHops);
        }
        let (ip, _) = node(entry.trim()).ok_or(ForwardedError::Malformed)?;
        let ip = ip.ok_or(ForwardedError::Malformed)?;
        hop = Some(ip);
        if !trusted(ip) {
            break;
        }
    }
    // The last value of each: what the nearest proxy set.
    let last = |name: &str| {
        let value = values(name).last()?;
        let text = std::str::from_utf8(value).ok()?;
        let item = text.rsplit(',').next()?.trim();
        (!item.is_empty()).then_some(Cow::Borrowed(item))
    };
    Ok(Some(Forwarded {
        client: hop,
        port: None,
        proto: last("x-forwarded-proto"),
        host: last("x-forwarded-host"),
    }))
}

/// The client's element of `Forwarded`: walked from the right past
/// trusted proxies.
fn from_elements<'a>(
    elements: &[&'a str],
    trusted: &impl Fn(IpAddr) -> bool,
) -> Result<Forwarded<'a>, ForwardedError> {
    let mut chosen = None;
    for (walked, element) in elements.iter().rev().enumerate() {
        if walked == MAX_HOPS {
            return Err(ForwardedError::TooManyHops);
        }
        let pairs = pairs(element)?;
        let for_node = pairs.iter().find(|(k, _)| k.eq_ignore_ascii_case("for"));
        let (ip, port) = match for_node {
            Some((_, value)) => node(value).ok_or(ForwardedError::Malformed)?,
            None => (None, None),
        };
        let ends = ip.is_none_or(|ip| !trusted(ip));
        chosen = Some((ip, port, pairs));
        if ends {
            break;
        }
    }
    let Some((client, port, pairs)) = chosen else {
        return Err(ForwardedError::Malformed);
    };
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.clone())
    };
    Ok(Forwarded {
        client,
        port,
        proto: get("proto"),
        host: get("host"),
    })
}

/// Splits a comma-separated list, commas inside quoted strings kept.
fn split_list<'a>(text: &'a str, out: &mut Vec<&'a str>) -> Result<(), ForwardedError> {
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, b) in text.bytes().enumerate() {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, false, b'"') => quoted = !quoted,
            (false, _, b',') => {
                push_item(&text[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
        if out.len() > 2 * MAX_HOPS {
            return Err(ForwardedError::TooManyHops);
        }
    }
    if quoted {
        return Err(ForwardedError::Malformed);
    }
    push_item(&text[start..], out);
    Ok(())
}

/// An element of a list; empty ones are allowed and skipped (RFC 9110,
/// 5.6.1).
fn push_item<'a>(item: &'a str, out: &mut Vec<&'a str>) {
    let item = item.trim_matches([' ', '\t']);
    if !item.is_empty() {
        out.push(item);
    }
}

/// A `Forwarded` element's pairs, `token=value`, `;`-separated; a quoted
/// value unescaped.
fn pairs(element: &str) -> Result<Vec<(&str, Cow<'_, str>)>, ForwardedError> {
    let mut out = Vec::new();
    let mut rest = element;
    loop {
        let (key, after) = rest.split_once('=').ok_or(ForwardedError::Malformed)?;
        let key = key.trim_matches([' ', '\t']);
        if key.is_empty() || !key.bytes().all(is_token) {
            return Err(ForwardedError::Malformed);
        }
        let (value, after) = value(after)?;
        if out
            .iter()
            .any(|(k, _): &(&str, _)| k.eq_ignore_ascii_case(key))
        {
            // Each parameter at most once per element (RFC 7239, 4).
            return Err(ForwardedError::Malformed);
        }
        out.push((key, value));
        let after = after.trim_start_matches([' ', '\t']);
        match after.strip_prefix(';') {
            Some(next) => rest = next,
            None if after.is_empty() => return Ok(out),
            None => return Err(ForwardedError::Malformed),
        }
    }
}

/// A token or a quoted string at the start of `text`, and what follows.
fn value(text: &str) -> Result<(Cow<'_, str>, &str), ForwardedError> {
    let Some(quoted) = text.strip_prefix('"') else {
        let end = text
            .bytes()
            .position(|b| !is_token(b))
            .unwrap_or(text.len());
        if end == 0 {
            return Err(ForwardedError::Malformed);
        }
        return Ok((Cow::Borrowed(&text[..end]), &text[end..]));
    };
    // Borrowed unless an escape makes the value differ from the text.
    let mut owned: Option<String> = None;
    let mut chars = quoted.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                let value = owned.map_or(Cow::Borrowed(&quoted[..i]), Cow::Owned);
                return Ok((value, &quoted[i + 1..]));
            }
            '\\' => {
                let (_, escaped) = chars.next().ok_or(ForwardedError::Malformed)?;
                owned
                    .get_or_insert_with(|| quoted[..i].to_owned())
                    .push(escaped);
            }
            c => {
                if let Some(owned) = &mut owned {
                    owned.push(c);
                }
            }
        }
    }
    Err(ForwardedError::Malformed)
}

/// RFC 9110's `tchar`.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A node (RFC 7239, 6): an IPv4 address, a bracketed IPv6 address, an
/// unbracketed one (`X-Forwarded-For` as many proxies write it),
/// `unknown` or an obfuscated name (`_...`), with an optional port (a
/// number, or obfuscated and then dropped). The address is `None` for
/// `unknown` and obfuscated names; `None` overall if it does not read.
fn node(text: &str) -> Option<(Option<IpAddr>, Option<u16>)> {
    let port = |text: &str| -> Option<Option<u16>> {
        if text.starts_with('_') && text.len() > 1 {
            return Some(None);
        }
        let digits =
            !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit());
        digits.then(|| text.parse().ok()).flatten().map(Some)
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let ip = IpAddr::V6(v6.parse::<Ipv6Addr>().ok()?);
        return match after {
            "" => Some((Some(ip), None)),
            _ => Some((Some(ip), port(after.strip_prefix(':')?)?)),
        };
    }
    if let Ok(v6) = text.parse::<Ipv6Addr>() {
        return Some((Some(IpAddr::V6(v6)), None));
    }
    let (name, port_text) = match text.split_once(':') {
        Some((name, port_text)) => (name, Some(port_text)),
        None => (text, None),
    };
    let port = match port_text {
        Some(p) => port(p)?,
        None => None,
    };
    if name.eq_ignore_ascii_case("unknown") {
        return Some((None, port));
    }
    if name.len() > 1
        && name.starts_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Some((None, port));
    }
    Some((Some(IpAddr::V4(name.parse::<Ipv4Addr>().ok()?)), port))
}

#[cfg(test)]
mod tests;
