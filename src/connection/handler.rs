//! The callbacks a server calls for each connection.

use std::borrow::Cow;

use crate::connection::conn::Conn;
use crate::handshake::Request;
use crate::proto::{CloseCode, Limits, Message};

/// What a server (or a client) does with its connections.
///
/// One handler serves every connection; per-connection data lives in
/// [`Handler::State`], made by the upgrade hook (or given to the client's
/// `connect`) and handed back to every
/// callback of that connection as `&mut`, so it needs no lock. For one connection
/// the callbacks run one at a time, in order: on a server
/// [`ServerHandler::on_upgrade`] (which makes the state), then
/// [`on_open`](Handler::on_open), any number of [`on_message`](Handler::on_message)
/// and [`on_drain`](Handler::on_drain), then [`on_close`](Handler::on_close)
/// exactly once. Callbacks run on the task that serves the connection, and on
/// tokio that task serves a whole group of connections: keep them short and
/// spawn anything slow, passing it a clone of the [`Conn`].
///
/// A callback that panics fails only its own connection, with close code 1011
/// (a panic in `on_upgrade` is answered with HTTP 500). A server's handler
/// also implements [`ServerHandler`] (an example is there).
pub trait Handler: Send + Sync + 'static {
    /// Per-connection state, owned by the connection.
    type State: Send + 'static;

    /// The connection is open; `conn` may already send.
    fn on_open(&self, conn: &Conn, state: &mut Self::State) {
        let _ = (conn, state);
    }

    /// A complete message arrived. It borrows the read buffer; call
    /// [`Message::into_owned`] to keep it beyond this call.
    fn on_message(&self, conn: &Conn, state: &mut Self::State, message: Message<'_>);

    /// The connection is over. `code` is the peer's close code
    /// ([`CloseCode::NO_STATUS`] if its close frame had none), the code the
    /// server sent when it failed the connection (1002, 1007, 1009, 1011), or
    /// [`CloseCode::ABNORMAL`] (1006) when TCP ended without a close handshake.
    fn on_close(&self, conn: &Conn, state: &mut Self::State, code: CloseCode, reason: &str) {
        let _ = (conn, state, code, reason);
    }

    /// The peer has caught up: a send was refused with
    /// [`SendError::QueueFull`](crate::SendError::QueueFull) (under
    /// [`SlowConsumer::Pause`](crate::SlowConsumer::Pause)) and the outbound
    /// queue has since been written out completely. Sends were accepted
    /// again as soon as the queue went below its bound; this is the moment
    /// to send what was skipped meanwhile (a snapshot, the latest state).
    fn on_drain(&self, conn: &Conn, state: &mut Self::State) {
        let _ = (conn, state);
    }

    /// Whether messages delivered to `on_message` may still be unanswered:
    /// they wait in a queue of the handler's own, or a task is handling them
    /// (as with `socket::SocketHandler`, while its
    /// socket reads). Asked when the peer's close frame arrives, or the peer
    /// breaks the protocol: while true, our close frame (the reply to the
    /// peer's, which echoes its code, or the failure's) waits until the
    /// handler calls [`Conn::close`] (with any code) or the close timeout
    /// passes, and sends are accepted meanwhile, so the replies to what the
    /// peer sent before it closed reach it first (RFC 6455 §5.5.1 lets an
    /// hub finish the message it is sending before its close). Nothing
    /// more is read meanwhile, and `on_close` is called at once, as always.
    /// The default, false, suits callbacks: each message was handled before
    /// the next frame was read.
    fn has_unhandled_messages(&self, state: &Self::State) -> bool {
        let _ = state;
        false
    }

    /// The connection is about to move to the next process of this program
    /// (a deploy that keeps every connection: feature `handoff`, the
    /// `handoff_socket` of the tokio and io_uring servers): its state as
    /// bytes, which the
    /// successor's [`Handler::take_over`] turns back into a state. Nothing
    /// else runs for this connection here afterwards: no `on_close`, no
    /// close frame; the successor carries on with the same TCP connection.
    ///
    /// `None`, the default, keeps the connection in this process, which
    /// closes it with 1012 (service restart) once the handoff is done, as a
    /// graceful shutdown would. Called only for a connection that can move
    /// (open, not closing); in the rare case that it starts to close before
    /// it leaves, it stays and `on_close` follows as usual.
    fn hand_off(&self, conn: &Conn, state: &mut Self::State) -> Option<Vec<u8>> {
        let _ = (conn, state);
        None
    }

    /// A connection handed over by the previous process arrives with the
    /// bytes its [`Handler::hand_off`] made: the state it goes on with
    /// (instead of `on_open`, which ran there). `conn` is its new handle
    /// (a new id), which may already send. `None` refuses it: it is closed
    /// with 1012 (service restart).
    fn take_over(&self, conn: &Conn, state: &[u8]) -> Option<Self::State> {
        let _ = (conn, state);
        None
    }
}

/// The callbacks only a server calls: the upgrade hook, which makes each
/// connection's state, and the answer to a plain HTTP request. Every server
/// (`tokio::Server`, `uring::Server`, `stream::Server`, the hyper and axum
/// upgrades) takes a `ServerHandler`; a client takes any [`Handler`], since
/// a client connection's state is given to `Client::connect` and nothing
/// asks it to upgrade.
///
/// ```
/// use rapidws::{Accept, Conn, Handler, Message, Reject, Request, ServerHandler};
///
/// struct Echo;
///
/// impl Handler for Echo {
///     type State = ();
///
///     fn on_message(&self, conn: &Conn, _state: &mut (), message: Message<'_>) {
///         let _ = conn.send(message);
///     }
/// }
///
/// impl ServerHandler for Echo {
///     fn on_upgrade(&self, _req: &Request<'_>, _accept: &mut Accept) -> Result<(), Reject> {
///         Ok(())
///     }
/// }
/// ```
///
/// A handler without it serves no upgrades: a server refuses it when the
/// program is compiled, not with a 500 at run time.
///
/// ```compile_fail
/// use rapidws::{Config, Conn, Handler, Message};
///
/// struct ClientOnly;
///
/// impl Handler for ClientOnly {
///     type State = ();
///
///     fn on_message(&self, _: &Conn, _: &mut (), _: Message<'_>) {}
/// }
///
/// async fn serve() {
///     let _ = rapidws::tokio::Server::bind("127.0.0.1:0", ClientOnly, Config::default()).await;
/// }
/// ```
pub trait ServerHandler: Handler {
    /// Decides on an upgrade request: return the new connection's state to
    /// accept it (optionally choosing a subprotocol with
    /// [`Accept::protocol`], or this connection's own limits), or a
    /// [`Reject`] to answer with an HTTP error. A panic here is answered
    /// with 500.
    fn on_upgrade(&self, request: &Request<'_>, accept: &mut Accept)
    -> Result<Self::State, Reject>;

    /// A request that is not a WebSocket upgrade (no `Upgrade: websocket`)
    /// arrived: answer it with `Some(response)` (a health check, a page),
    /// after which the server closes the connection; `None` (the default)
    /// refuses it as a bad upgrade (400, or 405 for a method other than
    /// GET), as before. `request` is not checked as an upgrade, and its
    /// [`key`](Request::key) is empty. Its [`body`](Request::body) is read
    /// whole first: up to `Config::max_http_body_size` (413 above it), given
    /// by `Content-Length` (411 for a chunked body). One request per
    /// connection: there is no keep-alive. A panic here is answered with 500.
    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        let _ = request;
        None
    }

    /// A handoff (feature `handoff`) is under way: what the whole server
    /// hands to the successor besides its connections (its pub/sub topics:
    /// `PubSub::hand_off`), as bytes
    /// for the successor's [`ServerHandler::take_over_server`]. Called once
    /// requests (plain HTTP, upgrades: the publishers of a bus) have
    /// stopped being handled here and before any connection moves, so no
    /// request changes it afterwards; the successor applies it before it
    /// serves anything. The default hands nothing.
    fn hand_off_server(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Takes what the predecessor's [`ServerHandler::hand_off_server`]
    /// made, before anything is served. An `Err` refuses the handoff (the
    /// predecessor serves on, and `take_over` returns the error). The
    /// default takes nothing.
    fn take_over_server(&self, state: &[u8]) -> Result<(), String> {
        let _ = state;
        Ok(())
    }

    /// A handoff failed after the successor took this server's state and
    /// served with it (it acknowledged the state and a batch of
    /// connections, then refused or lost a later one or the listening
    /// sockets, or went away): this server serves on with what it still
    /// has. Whatever the successor did with the state meanwhile must not
    /// be mistaken for this server's own (for a bus, publications it
    /// numbered: `PubSub::renumber` gives every topic a new epoch). Not
    /// called when the successor failed before it took a connection: it
    /// served nobody, so the state is still this server's alone. The
    /// default does nothing.
    fn take_back_server(&self) {}
}

/// A server's two callbacks as plain functions: the connection code that
/// serves clients too is generic over any [`Handler`], and carries these
/// (in `Env`) where it may meet a request. `None` on a client, which never
/// parses one.
pub(crate) struct Hooks<H: Handler> {
    pub(crate) on_upgrade: fn(&H, &Request<'_>, &mut Accept) -> Result<H::State, Reject>,
    pub(crate) on_http: fn(&H, &Request<'_>) -> Option<HttpResponse>,
}

impl<H: ServerHandler> Hooks<H> {
    /// `H`'s own callbacks, in a constant of `H`'s: a pointer's worth in
    /// every `Env` that carries them (a stream connection's task holds one).
    pub(crate) fn of() -> &'static Self {
        const {
            &Hooks {
                on_upgrade: H::on_upgrade,
                on_http: H::on_http,
            }
        }
    }
}

/// The upgrade hook's additions to the `101 Switching Protocols` response,
/// and this connection's own limits.
#[derive(Debug, Default)]
pub struct Accept {
    protocol: Option<Cow<'static, str>>,
    no_deflate: bool,
    max_frame_size: Option<usize>,
    max_message_size: Option<usize>,
}

impl Accept {
    /// Chooses the subprotocol to answer with. It must be one the client offered
    /// (see [`Request::protocols`]); otherwise the server refuses the upgrade
    /// with 500 and logs the mistake, because a client must fail a handshake
    /// that names a protocol it did not ask for.
    pub fn protocol(&mut self, protocol: impl Into<Cow<'static, str>>) -> &mut Self {
        self.protocol = Some(protocol.into());
        self
    }

    /// The subprotocol chosen so far.
    pub fn chosen_protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    /// Whether this connection may use permessage-deflate, when the server
    /// enables it (`Config::permessage_deflate`) and the client offers it.
    /// Default true; pass false, for example, for clients that send data
    /// that does not compress.
    pub fn permessage_deflate(&mut self, allow: bool) -> &mut Self {
        self.no_deflate = !allow;
        self
    }

    /// Whether permessage-deflate may be negotiated (see
    /// [`Accept::permessage_deflate`]).
    pub fn allows_permessage_deflate(&self) -> bool {
        !self.no_deflate
    }

    /// This connection's largest message, instead of the server's
    /// `Config::max_message_size`: a bigger one for an uploader the hook
    /// authenticated, a smaller one for an anonymous reader. A message over
    /// it fails the connection with 1009, as the server's limit does.
    /// Honoured by every driver (the socket servers, the stream driver,
    /// hyper's and axum's upgrades; over the axum builder's own limit).
    pub fn max_message_size(&mut self, bytes: usize) -> &mut Self {
        self.max_message_size = Some(bytes);
        self
    }

    /// This connection's largest frame, instead of the server's
    /// `Config::max_frame_size` (see [`Accept::max_message_size`]).
    pub fn max_frame_size(&mut self, bytes: usize) -> &mut Self {
        self.max_frame_size = Some(bytes);
        self
    }

    /// The limits set with [`Accept::max_frame_size`] and
    /// [`Accept::max_message_size`], over `limits`.
    pub(crate) fn limits_over(&self, mut limits: Limits) -> Option<Limits> {
        if self.max_frame_size.is_none() && self.max_message_size.is_none() {
            return None;
        }
        if let Some(bytes) = self.max_frame_size {
            limits.max_frame_size = bytes;
        }
        if let Some(bytes) = self.max_message_size {
            limits.max_message_size = bytes;
        }
        Some(limits)
    }
}

/// The answer to a plain HTTP request ([`ServerHandler::on_http`]): a status, a
/// content type, headers of the handler's own and a body, sent with
/// `Content-Length` and `Connection: close` (or `keep-alive`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    status: u16,
    content_type: Cow<'static, str>,
    headers: Vec<(Cow<'static, str>, Cow<'static, str>)>,
    body: bytes::Bytes,
}

impl HttpResponse {
    /// A response with `status` (100 to 599; anything else is sent as 500).
    pub fn new(
        status: u16,
        content_type: impl Into<Cow<'static, str>>,
        body: impl Into<bytes::Bytes>,
    ) -> Self {
        HttpResponse {
            status: if (100..=599).contains(&status) {
                status
            } else {
                500
            },
            content_type: content_type.into(),
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header (`WWW-Authenticate` with a 401, `Retry-After` with a
    /// 503, `Cache-Control`, ...). One the server writes itself
    /// (`Content-Type`, `Content-Length`, `Connection`,
    /// `Transfer-Encoding`), a name that is not an HTTP token, or a value
    /// with a control character other than tab (CR and LF above all: they
    /// would split the response) is left out, with a warning in the log.
    pub fn header(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<Cow<'static, str>>,
    ) -> Self {
        let (name, value) = (name.into(), value.into());
        if !crate::handshake::header_allowed(&name, &value) {
            tracing::warn!(%name, "HttpResponse::header left out: reserved, or not a valid name or value");
            return self;
        }
        self.headers.push((name, value));
        self
    }

    /// The headers added with [`header`](Self::header), in order.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.headers.iter().map(|(n, v)| (n.as_ref(), v.as_ref()))
    }

    /// `text/plain; charset=utf-8`.
    pub fn text(status: u16, body: impl Into<bytes::Bytes>) -> Self {
        HttpResponse::new(status, "text/plain; charset=utf-8", body)
    }

    /// 200, `text/html; charset=utf-8`.
    pub fn html(body: impl Into<bytes::Bytes>) -> Self {
        HttpResponse::new(200, "text/html; charset=utf-8", body)
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The `Content-Type` of the body.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }
}

/// Refuses an upgrade with an HTTP status and a one-line reason (the response
/// body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    status: u16,
    reason: Cow<'static, str>,
}

impl Reject {
    /// A refusal with `status`, which should be a 4xx or 5xx code; anything else
    /// is sent as 500.
    pub fn new(status: u16, reason: impl Into<Cow<'static, str>>) -> Self {
        let status = if (400..=599).contains(&status) {
            status
        } else {
            500
        };
        Reject {
            status,
            reason: reason.into(),
        }
    }

    /// 400 Bad Request.
    pub fn bad_request(reason: impl Into<Cow<'static, str>>) -> Self {
        Reject::new(400, reason)
    }

    /// 401 Unauthorized.
    pub fn unauthorized(reason: impl Into<Cow<'static, str>>) -> Self {
        Reject::new(401, reason)
    }

    /// 403 Forbidden.
    pub fn forbidden(reason: impl Into<Cow<'static, str>>) -> Self {
        Reject::new(403, reason)
    }

    /// 404 Not Found.
    pub fn not_found(reason: impl Into<Cow<'static, str>>) -> Self {
        Reject::new(404, reason)
    }

    /// The HTTP status the refusal answers with.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The reason, sent as the body (one line of plain text).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// A handler that does nothing, with no state: the drivers' size tests
/// measure their connections with it.
#[cfg(test)]
pub(crate) struct Quiet;

#[cfg(test)]
impl Handler for Quiet {
    type State = ();

    fn on_message(&self, _: &Conn, _: &mut (), _: Message<'_>) {}
}

#[cfg(test)]
impl ServerHandler for Quiet {
    fn on_upgrade(&self, _: &Request<'_>, _: &mut Accept) -> Result<(), Reject> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_keeps_error_statuses_and_maps_others_to_500() {
        assert_eq!(Reject::forbidden("no").status(), 403);
        assert_eq!(Reject::new(503, "busy").status(), 503);
        assert_eq!(Reject::new(200, "ok?").status(), 500);
        assert_eq!(Reject::new(101, "no").status(), 500);
        assert_eq!(Reject::not_found("where").reason(), "where");
    }

    #[test]
    fn accept_records_the_protocol() {
        let mut accept = Accept::default();
        assert_eq!(accept.chosen_protocol(), None);
        accept.protocol("chat");
        assert_eq!(accept.chosen_protocol(), Some("chat"));
    }
}
