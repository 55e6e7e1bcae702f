//! What a server shows its user besides serving, written once for every
//! driver: the handle, and shutting down and waiting (the stream driver,
//! axum's sockets, the client); the address and both sides of a handoff
//! (the socket servers, tokio and io_uring), whose settings are one type
//! for both. The public methods are written by macros into each server's
//! own `impl`, so that their docs live here once and every server keeps
//! them as inherent methods.

use std::sync::Arc;

use crate::connection::hub::Hub;

/// A server (or client) as the methods below reach it: the hub its
/// connections share.
pub(crate) trait Served {
    fn hub(&self) -> &Arc<Hub>;
}

/// `handle`, for every server. (`Self` implements [`Served`].)
#[cfg_attr(not(all(feature = "tokio", feature = "uring")), allow(unused_macros))]
macro_rules! handle_method {
    () => {
        /// A handle to count the connections or shut them down.
        pub fn handle(&self) -> $crate::ServerHandle {
            $crate::ServerHandle::new($crate::driver::surface::Served::hub(self).clone())
        }
    };
}

/// `handle`, `shutdown` and `shutdown_gracefully`, for a server whose
/// connections are tasks the caller spawned, so that there is no `serve`
/// to return when they are done. `Self` implements [`Served`]. The
/// attributes given (doc lines) say what becomes of new connections once
/// the shutdown began, in both methods' docs; those after `spread:` are
/// added to `shutdown_gracefully`'s.
#[cfg_attr(not(all(feature = "tokio", feature = "uring")), allow(unused_macros))]
macro_rules! shutdown_methods {
    ($(#[$refused:meta])* $(spread: $(#[$spread:meta])*)?) => {
        $crate::driver::surface::handle_method!();

        /// Shuts down gracefully: open connections get close 1001, and
        /// this waits for them, at most the config's `shutdown_timeout`,
        /// before dropping the rest.
        ///
        $(#[$refused])*
        pub async fn shutdown(&self) {
            self.handle().shutdown();
            $crate::driver::surface::Served::hub(self)
                .finish_shutdown()
                .await;
        }

        /// Shuts down gracefully with the closes spread (see
        /// [`ServerHandle::shutdown_spread`](crate::ServerHandle::shutdown_spread)):
        /// open connections get close 1012 spread over `window` with
        /// jitter, and this waits for them, at most `window` plus the
        /// config's `shutdown_timeout`.
        ///
        $(#[$refused])*
        $($(#[$spread])*)?
        pub async fn shutdown_gracefully(&self, window: ::std::time::Duration) {
            self.handle().shutdown_spread($crate::Spread::over(window));
            $crate::driver::surface::Served::hub(self)
                .finish_shutdown()
                .await;
        }
    };
}

/// The socket servers' shared methods: `local_addr`, `handle`,
/// `without_listener`, `entrance`, and, with the `handoff` feature on
/// Linux, `take_over`, `handoff_socket` and `after_handoff`. `Self`
/// implements [`Served`] and has the fields `listeners` (a `Vec` of TCP
/// listeners: one with `local_addr`), `door` (the entrance's `Keeper`)
/// and `handoff` ([`HandoffSettings`]), and `fn with(listeners, Arc<H>,
/// Config) -> Self`. `take_over` is `async` on tokio (the old process is
/// met on a blocking thread) and `blocking` on io_uring; the doc lines
/// given are added to its docs.
#[cfg_attr(not(all(feature = "tokio", feature = "uring")), allow(unused_macros))]
macro_rules! socket_server_methods {
    (take_over: $how:ident $(, $(#[$more:meta])*)?) => {
        /// The address the server listens on (useful after binding port
        /// 0). A server that took over answers with its predecessor's,
        /// whose listening sockets it will have once it has every
        /// connection.
        pub fn local_addr(&self) -> ::std::io::Result<::std::net::SocketAddr> {
            match self.listeners.first() {
                Some(listener) => listener.local_addr(),
                None => self.handoff.announced().ok_or_else(|| {
                    ::std::io::Error::new(::std::io::ErrorKind::NotConnected, "no listening socket")
                }),
            }
        }

        $crate::driver::surface::handle_method!();

        /// A server with no listening socket of its own: every connection
        /// comes through its [`entrance`](Self::entrance), from a
        /// `Router` (feature `route`) or an accept loop of yours. `serve`
        /// runs until the shutdown, as with a listener.
        pub fn without_listener(handler: H, config: $crate::Config) -> Self {
            Self::with(Vec::new(), ::std::sync::Arc::new(handler), config)
        }

        /// The way in for connections accepted elsewhere (a router's),
        /// served by this server while `serve` runs: see
        /// [`Entrance`](crate::driver::entrance::Entrance).
        pub fn entrance(&self) -> $crate::driver::entrance::Entrance {
            self.door.entrance()
        }

        $crate::driver::surface::socket_server_methods! {
            @take_over $how
            /// Takes over from the server of this program (on tokio or on
            /// io_uring) that listens for a successor at `path` (its
            /// [`handoff_socket`](Self::handoff_socket)): its server state
            /// now
            /// ([`ServerHandler::take_over_server`](crate::ServerHandler::take_over_server)),
            /// and, once `serve` runs, every connection that can move,
            /// each going on where it was (no close, no reconnect, nothing
            /// read twice or lost), then its listening sockets; the old
            /// process then closes what stays with 1012 and its `serve`
            /// returns. The handler's
            /// [`Handler::take_over`](crate::Handler::take_over) turns each
            /// connection's state back into a state. Give the same
            /// `config` the old process had (a connection whose limits are
            /// above this one's is refused).
            ///
            /// The listening sockets are handed over last, once every
            /// connection has moved: until then the old process holds them
            /// alone (accepting nothing: new connections wait in its
            /// accept queues, and this server accepts them once it has
            /// them), so a handoff that fails before the end leaves one
            /// process accepting, the old one.
            /// [`local_addr`](Self::local_addr) answers from the start.
            ///
            /// Errors if no process listens at `path`, if it runs as
            /// another user than this process (`PermissionDenied`, naming
            /// both: the kernel's `SO_PEERCRED` is asked before anything
            /// is read; even root does not take over another user's
            /// server), or if it does not greet as a handoff does.
            /// (Linux, feature `handoff`.)
            $($(#[$more])*)?
        }

        /// Listens at `path` (a Unix socket, mode 0600) for a successor:
        /// a new process of this program started with `take_over` on the
        /// same path, on tokio or on io_uring. When one connects, the
        /// server stops accepting, hands it every connection that can
        /// move (an open connection whose handler implements
        /// [`Handler::hand_off`](crate::Handler::hand_off), not closing,
        /// with permessage-deflate only without context takeover; a
        /// request still coming in; never a TLS connection: those are
        /// closed with 1012) and last its listening sockets, closes the
        /// rest with 1012 and returns from `serve`.
        ///
        /// Only this process's user can reach the socket, from the
        /// instant it exists (it is bound in a private directory, made
        /// 0600 there, and renamed to `path`); the directory that holds
        /// `path` must belong to this user or root, and be writable by no
        /// other user unless it is sticky (as /tmp), or this is an error.
        /// A process that connects is handed nothing unless the kernel
        /// says it runs as this user or root (`SO_PEERCRED`; others are
        /// logged with their pid and uid) and it greets back as a
        /// successor within 2 s; until then nothing is frozen. Then each
        /// of its answers has 2 s. If the successor fails before the end
        /// (refuses, dies, says something else, or is silent), the server
        /// takes back what it did not hand over, keeps its listening
        /// sockets (the successor never had them) and goes on serving and
        /// accepting at once; its
        /// [`ServerHandler::take_back_server`](crate::ServerHandler::take_back_server)
        /// is called only if the successor had taken connections, having
        /// taken the state.
        ///
        /// A socket file left at `path` by a process that ended is
        /// replaced; one where a process still listens is an error, unless
        /// this server took over from there: then it listens there once
        /// its predecessor is done (until then the path is the
        /// predecessor's, which keeps it should the handoff fail). (Linux,
        /// feature `handoff`.)
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        pub fn handoff_socket(
            mut self,
            path: impl AsRef<::std::path::Path>,
        ) -> ::std::io::Result<Self> {
            self.handoff.listen_at(path.as_ref())?;
            Ok(self)
        }

        /// How the connections that do not move are closed once a
        /// successor has the rest
        /// ([`handoff_socket`](Self::handoff_socket)): by default with
        /// 1012, all at once; with a [`Spread`](crate::Spread) over a
        /// window, as a graceful shutdown spreads them, so that their clients
        /// do not all reconnect in the same second (a handler that keeps
        /// its connections keeps them all). (Linux, feature `handoff`.)
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        pub fn after_handoff(mut self, spread: $crate::Spread) -> Self {
            self.handoff.after = Some(spread);
            self
        }
    };
    (@take_over async $(#[$doc:meta])*) => {
        $(#[$doc])*
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        pub async fn take_over(
            path: impl AsRef<::std::path::Path>,
            handler: H,
            config: $crate::Config,
        ) -> ::std::io::Result<Self> {
            let handler = ::std::sync::Arc::new(handler);
            let (path, meeting) = (path.as_ref().to_owned(), handler.clone());
            let handoff = ::tokio::task::spawn_blocking(move || {
                $crate::driver::surface::HandoffSettings::took_over(&path, &*meeting)
            })
            .await
            .map_err(::std::io::Error::other)??;
            // Its listening sockets come at the end of the handoff.
            let mut server = Self::with(Vec::new(), handler, config);
            server.handoff = handoff;
            Ok(server)
        }
    };
    (@take_over blocking $(#[$doc:meta])*) => {
        $(#[$doc])*
        #[cfg(all(target_os = "linux", feature = "handoff"))]
        pub fn take_over(
            path: impl AsRef<::std::path::Path>,
            handler: H,
            config: $crate::Config,
        ) -> ::std::io::Result<Self> {
            let handler = ::std::sync::Arc::new(handler);
            let handoff =
                $crate::driver::surface::HandoffSettings::took_over(path.as_ref(), &*handler)?;
            // Its listening sockets come at the end of the handoff.
            let mut server = Self::with(Vec::new(), handler, config);
            server.handoff = handoff;
            Ok(server)
        }
    };
}

// (Each is used in the full build, which is checked for unused code.)
#[cfg_attr(not(all(feature = "tokio", feature = "uring")), allow(unused_imports))]
pub(crate) use {handle_method, shutdown_methods, socket_server_methods};

/// A socket server's two sides of a handoff, as its builder set them; the
/// driver turns them into its own waiting when it serves.
#[cfg(all(target_os = "linux", feature = "handoff"))]
#[derive(Default)]
pub(crate) struct HandoffSettings {
    /// Where it waits for a successor.
    pub(crate) socket: Option<crate::handoff::socket::HandoffSocket>,
    /// Where it is to wait for one once its predecessor (which listens
    /// there now) is done.
    pub(crate) later: Option<std::path::PathBuf>,
    /// Where it took over from, and the channel the predecessor's
    /// connections come on (its state was applied already).
    pub(crate) predecessor: Option<(std::path::PathBuf, crate::handoff::protocol::Successor)>,
    /// How what stays is closed once a successor has the rest (default:
    /// 1012, all at once).
    pub(crate) after: Option<crate::Spread>,
}

#[cfg(all(target_os = "linux", feature = "handoff"))]
impl HandoffSettings {
    /// Meets the process listening at `path` and applies its server state
    /// to `handler` (see `handoff::arrive::meet`). Blocking.
    pub(crate) fn took_over<H: crate::ServerHandler>(
        path: &std::path::Path,
        handler: &H,
    ) -> std::io::Result<Self> {
        let apply = |state: &[u8]| handler.take_over_server(state);
        let successor = crate::handoff::arrive::meet(path, apply)?;
        Ok(HandoffSettings {
            predecessor: Some((path.to_owned(), successor)),
            ..HandoffSettings::default()
        })
    }

    /// Listens for a successor at `path`, or, if the predecessor listens
    /// there, once it is done.
    pub(crate) fn listen_at(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        if matches!(&self.predecessor, Some((from, _)) if from == path) {
            // The predecessor listens there until it is done.
            self.later = Some(path.to_owned());
        } else {
            let socket = crate::handoff::socket::HandoffSocket::bind(path, false)?;
            self.socket = Some(socket);
        }
        Ok(())
    }

    /// Where the predecessor's listening sockets listen, if this server
    /// took over (they come at the end of the handoff).
    pub(crate) fn announced(&self) -> Option<std::net::SocketAddr> {
        let (_, successor) = self.predecessor.as_ref()?;
        successor.announced().first().copied()
    }

    /// How many listening sockets come at the end of the handoff, if
    /// this server took over.
    pub(crate) fn coming(&self) -> usize {
        self.predecessor
            .as_ref()
            .map_or(0, |(_, successor)| successor.announced().len())
    }

    /// How what stays is closed once a successor has the rest.
    pub(crate) fn after_spread(&self) -> crate::Spread {
        self.after
            .clone()
            .unwrap_or_else(|| crate::Spread::over(std::time::Duration::ZERO))
    }
}

/// Without the `handoff` feature: nothing to hand over or take over.
#[cfg(not(all(target_os = "linux", feature = "handoff")))]
#[derive(Default)]
pub(crate) struct HandoffSettings(());

#[cfg(not(all(target_os = "linux", feature = "handoff")))]
impl HandoffSettings {
    pub(crate) fn announced(&self) -> Option<std::net::SocketAddr> {
        None
    }

    pub(crate) fn coming(&self) -> usize {
        0
    }
}
