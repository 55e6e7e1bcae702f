//! The examples' echo: every text and binary message sent back with its
//! opcode (echo, axum_echo's `/ws`, h3_echo's `/ws`).

use rapidws::{Accept, Conn, Handler, HttpResponse, Message, Reject, Request, ServerHandler};

/// Echoes every message; where upgrades are taken and what answers other
/// HTTP requests are the example's.
pub struct Echo {
    /// The one path upgrades are taken at (404 elsewhere, saying where
    /// the echo is); every path if `None`.
    pub path: Option<&'static str>,
    /// What answers a request that is not an upgrade (`None`: the
    /// server's own answer).
    pub http: fn(&Request<'_>) -> Option<HttpResponse>,
}

impl Echo {
    /// Upgrades on every path; no answer of its own to other requests.
    pub fn anywhere() -> Echo {
        Echo {
            path: None,
            http: |_| None,
        }
    }

    /// Upgrades at `path` only.
    pub fn at(path: &'static str) -> Echo {
        Echo {
            path: Some(path),
            ..Echo::anywhere()
        }
    }
}

impl Handler for Echo {
    type State = ();

    fn on_message(&self, conn: &Conn, _state: &mut (), message: Message<'_>) {
        if let Err(error) = conn.send(message) {
            tracing::debug!(id = conn.id(), %error, "echo not sent");
        }
    }

    /// An echo has no state of its own: every connection may move to the
    /// next process (`--handoff-socket`, `--take-over`).
    fn hand_off(&self, _conn: &Conn, _state: &mut ()) -> Option<Vec<u8>> {
        Some(Vec::new())
    }

    fn take_over(&self, _conn: &Conn, state: &[u8]) -> Option<()> {
        state.is_empty().then_some(())
    }
}

impl ServerHandler for Echo {
    fn on_upgrade(&self, request: &Request<'_>, _accept: &mut Accept) -> Result<(), Reject> {
        match (self.path, request.path()) {
            (None, _) => Ok(()),
            (Some(at), path) if path == at => Ok(()),
            (Some(at), path) => Err(Reject::new(
                404,
                format!("no WebSocket endpoint at {path}: the echo is at {at}"),
            )),
        }
    }

    fn on_http(&self, request: &Request<'_>) -> Option<HttpResponse> {
        (self.http)(request)
    }
}
