//! Who a publication is from, carried in its payload (the pub/sub carries
//! bytes only, through history and Redis alike): a [`ClientInfo`] as
//! length-prefixed parts, for join and leave events and for a client's own
//! publications, which start with [`MARK`] and end with their data.

use bytes::Bytes;

use crate::centrifuge::{ClientInfo, Format, is_json};

/// What a client's publication starts with: no JSON text starts with a
/// NUL (so no API publication does), and an application that publishes
/// binary payloads of its own through the `PubSub` must not start one
/// with these bytes.
const MARK: &[u8; 4] = b"\0ci\x01";

/// Appends `info`: its user, client, connection info and channel info,
/// each behind its length (4 bytes, big endian).
pub(super) fn put(out: &mut Vec<u8>, info: &ClientInfo) {
    for part in [
        info.user.as_bytes(),
        info.client.as_bytes(),
        &info.conn_info[..],
        &info.chan_info[..],
    ] {
        out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(part);
    }
}

/// The bytes `put` writes for `info`.
pub(super) fn len(info: &ClientInfo) -> usize {
    16 + info.user.len() + info.client.len() + info.conn_info.len() + info.chan_info.len()
}

/// Reads what `put` wrote from the front of `bytes`, leaving the rest;
/// `None` for anything else.
pub(super) fn take(bytes: &mut &[u8]) -> Option<ClientInfo> {
    let mut part = || -> Option<&[u8]> {
        let (len, tail) = bytes.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        if len > tail.len() {
            return None;
        }
        let (part, tail) = tail.split_at(len);
        *bytes = tail;
        Some(part)
    };
    let user = String::from_utf8(part()?.to_vec()).ok()?;
    let client = String::from_utf8(part()?.to_vec()).ok()?;
    let conn_info = Bytes::copy_from_slice(part()?);
    let chan_info = Bytes::copy_from_slice(part()?);
    Some(ClientInfo {
        user,
        client,
        conn_info,
        chan_info,
    })
}

/// A client's publication as published: the mark, who, then the data.
pub(super) fn publication(info: &ClientInfo, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MARK.len() + len(info) + data.len());
    out.extend_from_slice(MARK);
    put(&mut out, info);
    out.extend_from_slice(data);
    out
}

/// A payload's publisher and data: `None` for a publication no client
/// made (the HTTP API's, the application's), whose payload is all data.
pub(super) fn split(payload: &[u8]) -> Option<(ClientInfo, &[u8])> {
    let mut rest = payload.strip_prefix(MARK)?;
    let info = take(&mut rest)?;
    Some((info, rest))
}

/// `info` fit for `format`: in JSON, an info that is not JSON (from a
/// Redis that is not trusted) is left out rather than break the line.
pub(super) fn fit(format: Format, mut info: ClientInfo) -> ClientInfo {
    if format == Format::Json {
        for part in [&mut info.conn_info, &mut info.chan_info] {
            if !part.is_empty() && !is_json(part) {
                *part = Bytes::new();
            }
        }
    }
    info
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A publisher with every field, for the tests here and beside.
    pub(in crate::centrifuge::server) fn info() -> ClientInfo {
        ClientInfo {
            user: "ann".into(),
            client: "c-1".into(),
            conn_info: Bytes::from_static(br#"{"team":"blue"}"#),
            chan_info: Bytes::from_static(br#"{"seat":4}"#),
        }
    }

    #[test]
    fn a_publication_reads_back_as_written() {
        let payload = publication(&info(), b"{\"x\":1}");
        assert_eq!(payload.len(), MARK.len() + len(&info()) + 7);
        assert_eq!(split(&payload), Some((info(), &b"{\"x\":1}"[..])));
        let anonymous = ClientInfo::default();
        assert_eq!(
            split(&publication(&anonymous, b"")),
            Some((anonymous, &b""[..]))
        );
        // The API's and the application's: no publisher.
        assert_eq!(split(b"{\"x\":1}"), None);
        assert_eq!(split(b""), None);
    }

    #[test]
    fn a_cut_publication_has_no_publisher() {
        let payload = publication(&info(), b"");
        for len in 0..payload.len() {
            assert_eq!(split(&payload[..len]), None, "cut at {len}");
        }
        // A length past the end.
        let mut lying = payload;
        lying[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(split(&lying), None);
    }

    #[test]
    fn json_leaves_out_an_info_that_is_not_json() {
        let mut odd = info();
        odd.chan_info = Bytes::from_static(b"\xff");
        let fit_json = fit(Format::Json, odd.clone());
        assert_eq!(fit_json.chan_info, Bytes::new());
        assert_eq!(fit_json.conn_info, info().conn_info);
        assert_eq!(fit(Format::Protobuf, odd.clone()), odd);
    }
}
