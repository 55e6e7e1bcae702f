//! The server's answer to an upgrade request: the sans-I/O handshake pieces
//! (`handshake/`) put together with the connection limit, the handler's
//! upgrade hook and the server's permessage-deflate settings. Every driver
//! call [`answer`] with the bytes received so far.

use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use bytes::BytesMut;

use crate::connection::config::Config;
use crate::connection::conn::Conn;
use crate::connection::handler::{Accept, Handler, Hooks, HttpResponse, Reject};
use crate::connection::hub::Hub;
use crate::connection::meters::rejection_reason;
use crate::connection::proxied::told_by;
use crate::handshake::{
    ForwardedError, HandshakeError, Head, Request, header_buffer, negotiate, parse_head,
    write_accept, write_continue, write_error, write_http_response,
};
use crate::proto::deflate::{DeflateConfig, DeflateParams};
use crate::proto::{Limits, Role, WriteQueue};

/// A connection whose upgrade was done elsewhere, as every driver takes it:
/// a server's whose request was checked and answered by hyper or axum (or by
/// the caller of `stream::Server::serve_upgraded`), or a client's whose `101`
/// was read and checked. (A connection whose request comes next starts at
/// `Lifecycle::accept` instead, and its lifecycle makes one of these when it
/// accepts the request.)
pub(crate) struct Upgraded<S> {
    /// The handler's state for the connection.
    pub(crate) state: S,
    /// The permessage-deflate parameters agreed, if any.
    pub(crate) deflate: Option<DeflateParams>,
    /// The connection's own settings, if the upgrade set any.
    pub(crate) settings: Option<Box<Settings>>,
    /// Which end this is: a server, or a client (whose frames are masked).
    pub(crate) role: Role,
    /// Bytes read after the handshake (the first frames): the driver's
    /// first input.
    pub(crate) prefix: BytesMut,
    /// Told the connection's handle once it is open (a client hands it out).
    pub(crate) hand_out: Option<HandOut>,
}

/// Where an upgraded connection's `Conn` goes once `on_open` has run (see
/// [`Upgraded::hand_out`]).
pub(crate) type HandOut = Box<dyn FnOnce(&Conn) + Send>;

impl<S> Upgraded<S> {
    /// A server's connection whose `101` was sent, with nothing read after it.
    pub(crate) fn server(state: S, deflate: Option<DeflateParams>) -> Self {
        Upgraded {
            state,
            deflate,
            settings: None,
            role: Role::Server,
            prefix: BytesMut::new(),
            hand_out: None,
        }
    }
}

/// Settings one connection uses instead of its server's: the axum
/// extractor's builder sets them per upgrade. Read once when the connection
/// opens (the session copies the limits, the compressor its settings), so a
/// connection keeps nothing of them.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) limits: Limits,
    /// The permessage-deflate settings; `None`: not offered.
    pub(crate) deflate: Option<DeflateConfig>,
}

/// The connection's own settings: `own` (an upgrade's, such as the axum
/// builder's) or else the server's, with the limits the upgrade hook set on
/// `accept` over them; `None` if neither changed anything.
pub(crate) fn settings(
    accept: &Accept,
    own: Option<&Settings>,
    config: &Config,
) -> Option<Box<Settings>> {
    let base = own.map_or_else(|| config.limits(), |own| own.limits);
    let Some(limits) = accept.limits_over(base) else {
        return own.cloned().map(Box::new);
    };
    let deflate = own.map_or_else(|| config.deflate().copied(), |own| own.deflate);
    Some(Box::new(Settings { limits, deflate }))
}

/// Room for a response: a `101` with a subprotocol and permessage-deflate
/// parameters, or an error with its reason, fits.
const RESPONSE_BUFFER: usize = 512;

/// What to do after looking at the bytes received so far on a new connection.
pub(crate) enum Answer<S> {
    /// The request head is not complete yet.
    Incomplete,
    /// The `101` is queued; the first `head_len` bytes were the request.
    /// `deflate` holds the permessage-deflate parameters, if agreed;
    /// `settings` the connection's own, if the upgrade hook set limits.
    Accepted {
        state: S,
        head_len: usize,
        deflate: Option<DeflateParams>,
        settings: Option<Box<Settings>>,
        /// The client's address, as trusted proxies told it.
        client: Option<SocketAddr>,
    },
    /// A response is queued (an error, or the handler's answer to a plain
    /// HTTP request); close after writing it.
    Refused,
    /// The handler's answer to a plain HTTP request is queued, and the
    /// connection carries the next request: the first `consumed` bytes were
    /// this one (head and body).
    Answered { consumed: usize },
    /// A plain HTTP request's head is complete and its body is not: call
    /// again, from the start, once the first `end` bytes are here.
    Body { end: usize },
}

/// What [`answer`] knows of the connection a request came on.
pub(crate) struct Carrier {
    /// Its peer: the client, or a proxy (see `proxied::told_by`).
    pub(crate) peer: SocketAddr,
    /// Whether it may carry another request after this one.
    pub(crate) may_keep_alive: bool,
}

/// Parses the request in `buf`, refuses it with 503 if the server is at its
/// connection limit, asks the handler's upgrade hook, negotiates
/// permessage-deflate if the config enables it, and queues the response. The
/// part of the handshake every driver shares.
///
/// `arrived_from` is where the bytes that arrived since the last call start.
/// The head ends with a line, so until a new line arrives (or the head passes
/// its limit) parsing again would only redo the same work: think of a client
/// that sends one byte at a time.
pub(crate) fn answer<H: Handler>(
    buf: &[u8],
    arrived_from: usize,
    handler: &H,
    hooks: &Hooks<H>,
    hub: &Hub,
    out: &mut WriteQueue,
    carrier: Carrier,
) -> Answer<H::State> {
    let Carrier {
        peer,
        may_keep_alive,
    } = carrier;
    let max_head_len = hub.config.max_handshake_size;
    let pool = &hub.pool;
    let new_line = buf
        .get(arrived_from..)
        .is_some_and(|new| new.contains(&b'\n'));
    if !new_line && buf.len() <= max_head_len {
        return Answer::Incomplete;
    }
    let mut headers = header_buffer();
    let Some(parsed) = parse_head(buf, &mut headers, max_head_len).transpose() else {
        return Answer::Incomplete;
    };
    // The response goes into a pooled buffer, which the connection's queue
    // gives back once it is written. Allocating it instead, once per
    // handshake, left holes in the heap that idle connections paid for
    // (measured: about 140 bytes each on the tokio backend).
    if out.needs_buffer()
        && let Some(unused) = out.provide_buffer(pool.take(RESPONSE_BUFFER))
    {
        pool.give(unused);
    }
    let (head, head_len) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return refuse(out, hub, e),
    };
    if !head.wants_websocket() {
        // Plain HTTP: its body, bounded, is read whole before the handler
        // sees the request.
        let body_len = match head.body_len() {
            Ok(n) if n > hub.config.max_http_body_size => {
                return refuse(out, hub, HandshakeError::BodyTooLarge);
            }
            Ok(n) => n,
            Err(e) => return refuse(out, hub, e),
        };
        let end = head_len + body_len;
        if buf.len() < end {
            // Asked once per request: the body is awaited whole before
            // the head is parsed again.
            if head.expects_continue() {
                write_continue(out);
            }
            return Answer::Body { end };
        }
        let keep_alive = may_keep_alive && head.keeps_alive();
        let request = head.as_request(&buf[head_len..end]);
        let request = match told_by(&request, peer, &hub.config.trusted_proxies) {
            Ok(told) => request.with_peer_addr(told.client.unwrap_or(peer)),
            Err(e) => return refuse_forwarded(out, hub, peer, e),
        };
        if answer_http(&head, &request, handler, hooks, out, keep_alive) {
            return if keep_alive {
                Answer::Answered { consumed: end }
            } else {
                Answer::Refused
            };
        }
    }
    let request = match head.check() {
        Ok(request) => request,
        Err(e) => return refuse(out, hub, e),
    };
    let told = match told_by(&request, peer, &hub.config.trusted_proxies) {
        Ok(told) => told,
        Err(e) => return refuse_forwarded(out, hub, peer, e),
    };
    let request = request.with_peer_addr(told.client.unwrap_or(peer));
    let host = told.host.as_deref().map(str::as_bytes);
    match decide(
        &request,
        handler,
        hooks,
        hub,
        Accept::default(),
        hub.config.deflate(),
        host,
    ) {
        Decision::Refused(reject) => {
            write_error(out, reject.status(), reject.reason());
            Answer::Refused
        }
        Decision::Accepted {
            state,
            accept,
            deflate,
        } => {
            let protocol = accept.chosen_protocol();
            write_accept(out, request.key(), protocol, deflate.as_ref());
            Answer::Accepted {
                state,
                head_len,
                deflate,
                settings: settings(&accept, None, &hub.config),
                client: told.client,
            }
        }
    }
}

/// Queues the response for a request that failed to parse or to check.
fn refuse<S>(out: &mut WriteQueue, hub: &Hub, e: HandshakeError) -> Answer<S> {
    tracing::debug!(status = e.status(), reason = e.reason(), "refused upgrade");
    hub.meters().rejected(rejection_reason(&e));
    write_error(out, e.status(), e.reason());
    Answer::Refused
}

/// Queues the 400 for a trusted proxy's forwarding header that does not
/// read.
fn refuse_forwarded<S>(
    out: &mut WriteQueue,
    hub: &Hub,
    peer: SocketAddr,
    e: ForwardedError,
) -> Answer<S> {
    tracing::debug!(%peer, reason = e.reason(), "refused request");
    hub.meters().rejected("forwarded");
    write_error(out, 400, e.reason());
    Answer::Refused
}

/// The handler's answer to a request that is not an upgrade, queued, if it
/// gives one (`Handler::on_http`; a panic there is a 500): true if it did.
/// With `keep_alive` the response says the connection stays open.
fn answer_http<'a, H: Handler>(
    head: &Head<'a>,
    request: &Request<'a>,
    handler: &H,
    hooks: &Hooks<H>,
    out: &mut WriteQueue,
    keep_alive: bool,
) -> bool {
    let response = match catch_unwind(AssertUnwindSafe(|| (hooks.on_http)(handler, request))) {
        Ok(Some(response)) => response,
        Ok(None) => return false,
        Err(_) => {
            tracing::error!("on_http panicked; answered 500");
            HttpResponse::text(500, "internal server error\n")
        }
    };
    let headers: Vec<(&str, &str)> = response.headers().collect();
    write_http_response(
        out,
        response.status(),
        response.content_type(),
        &headers,
        response.body(),
        head.is_head(),
        keep_alive,
    );
    true
}

/// What the server decided on a checked request.
pub(crate) enum Decision<S> {
    /// Upgrade: the hook's state, its `Accept` (the subprotocol chosen),
    /// and the permessage-deflate parameters agreed, if any.
    Accepted {
        state: S,
        accept: Accept,
        deflate: Option<DeflateParams>,
    },
    /// Answer with this status and reason.
    Refused(Reject),
}

/// Refuses the request with 503 if the server is at its connection limit,
/// asks the handler's upgrade hook (a panic there is a 500) with `accept` as
/// it starts, checks the subprotocol chosen, and negotiates
/// permessage-deflate if `deflate` is set: every server's decision, whoever
/// parsed the request. `deflate` is the server's setting
/// (`hub.config.deflate()`) unless the upgrade has its own; `host`, the
/// `Host` a trusted proxy says the client sent, if one did.
pub(crate) fn decide<H: Handler>(
    request: &Request<'_>,
    handler: &H,
    hooks: &Hooks<H>,
    hub: &Hub,
    mut accept: Accept,
    deflate: Option<&DeflateConfig>,
    host: Option<&[u8]>,
) -> Decision<H::State> {
    let origin = request.header("origin");
    let host = host.or_else(|| request.header("host"));
    if !hub.config.origins.allow(origin, host) {
        tracing::debug!(
            origin = %String::from_utf8_lossy(origin.unwrap_or_default()),
            "refused upgrade: a page of another origin"
        );
        hub.meters().rejected("origin");
        return Decision::Refused(Reject::new(
            403,
            "a page of this origin may not open a WebSocket here \
             (the server lets in other origins with Config::allow_origins)",
        ));
    }
    if !hub.has_room() {
        tracing::debug!("refused upgrade: connection limit reached");
        hub.meters().rejected("connection_limit");
        return Decision::Refused(Reject::new(
            503,
            "connection limit reached, try again later",
        ));
    }
    let decision = catch_unwind(AssertUnwindSafe(|| {
        (hooks.on_upgrade)(handler, request, &mut accept)
    }));
    let internal_error = || {
        hub.meters().rejected("internal");
        Decision::Refused(Reject::new(500, "internal server error"))
    };
    match decision {
        Err(_) => {
            tracing::error!("on_upgrade panicked; answered 500");
            internal_error()
        }
        Ok(Err(reject)) => {
            hub.meters().rejected("handler");
            Decision::Refused(reject)
        }
        Ok(Ok(state)) => {
            if let Some(chosen) = accept.chosen_protocol()
                && !request.protocols().any(|offered| offered == chosen)
            {
                tracing::error!(
                    protocol = chosen,
                    "on_upgrade chose a subprotocol the client did not offer; answered 500"
                );
                return internal_error();
            }
            let deflate = deflate
                .filter(|_| accept.allows_permessage_deflate())
                .and_then(|config| negotiate(request.extension_offers(), config));
            Decision::Accepted {
                state,
                accept,
                deflate,
            }
        }
    }
}
