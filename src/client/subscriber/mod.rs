//! [`Subscriber`]: a bus subscriber that keeps its subscriptions alive,
//! reconnecting with backoff and resuming every topic after the last
//! position it delivered (features `client` and `bus`).
//!
//! ```no_run
//! use rapidws::client::Subscriber;
//! use rapidws::client::subscriber::Event;
//!
//! # async fn run() {
//! let mut subscriber = Subscriber::builder("ws://127.0.0.1:9004/ws")
//!     .topics(["news", "scores"])
//!     .start();
//! while let Some(event) = subscriber.next().await {
//!     match event {
//!         Event::Delivery { topic, position, data } => println!("{topic} {position} {data:?}"),
//!         Event::Discontinuity { topic } => println!("# not recovered {topic}"),
//!         _ => {}
//!     }
//! }
//! # }
//! ```
//!
//! | file | concern |
//! |---|---|
//! | `event.rs` | [`Event`]: what the application is told |
//! | `resume.rs` | each topic's last position, the resuming query, what is delivered once |
//! | `backoff.rs` | [`Backoff`]: capped exponential windows, full jitter |

mod backoff;
mod event;
mod resume;

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use backoff::Backoff;
pub use event::Event;
use resume::Resume;

use super::{Client, ConnectRequest, Inboxes};
use crate::bus::Incoming;
use crate::proto::{CloseCode, OwnedMessage};

/// Sets up a [`Subscriber`] ([`Subscriber::builder`]).
#[derive(Debug)]
pub struct Builder {
    url: String,
    topics: Vec<String>,
    backoff: Backoff,
    client: Option<Client<Inboxes>>,
    stable: Duration,
}

impl Builder {
    /// The topics to subscribe to (each once).
    pub fn topics<I, T>(mut self, topics: I) -> Builder
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// The reconnect delays ([`Backoff::default`]: 250 ms doubling up to
    /// 30 s, full jitter).
    pub fn backoff(mut self, backoff: Backoff) -> Builder {
        self.backoff = backoff;
        self
    }

    /// The client to connect with: its TLS roots for `wss://`, HTTP/3
    /// ([`Client::http3`]), a proxy, limits. Share one among many
    /// subscribers, as its connections share its connection groups. By
    /// default one `Client::new(Config::default())` that every subscriber
    /// of the process shares.
    pub fn client(mut self, client: Client<Inboxes>) -> Builder {
        self.client = Some(client);
        self
    }

    /// Starts subscribing on a task of the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(self) -> Subscriber {
        let (events, receiver) = mpsc::channel(1024);
        let (stop, stopped) = watch::channel(false);
        let client = self.client.unwrap_or_else(shared_client);
        let run = Run {
            url: self.url,
            resume: Resume::new(self.topics),
            backoff: self.backoff,
            client,
            events,
            stopped,
            stable: self.stable,
        };
        Subscriber {
            events: receiver,
            stop,
            task: Some(tokio::spawn(run.run())),
        }
    }
}

/// A subscriber to a bus (`rapidws::bus`, or any server of its contract)
/// that keeps its subscriptions: see the module docs. Dropping it stops it
/// too; [`Subscriber::stop`] waits until the connection closed.
#[derive(Debug)]
pub struct Subscriber {
    events: mpsc::Receiver<Event>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Subscriber {
    /// A subscriber to the bus's WebSocket endpoint `url` (e.g.
    /// `ws://127.0.0.1:9004/ws`, `wss://...`); it adds the query.
    pub fn builder(url: impl Into<String>) -> Builder {
        Builder {
            url: url.into(),
            topics: Vec::new(),
            backoff: Backoff::default(),
            client: None,
            stable: Duration::from_secs(5),
        }
    }

    /// The next event; `None` once stopped. Events wait for the
    /// application (1,024 of them): while they do, the connection is not
    /// read, and a bus that drops for slow readers tells of the gap.
    pub async fn next(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Stops: closes the connection with 1000 (waiting at most 2 s for the
    /// close handshake) and makes no other. Events not read are dropped.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        self.events.close();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// The task behind a [`Subscriber`].
struct Run {
    url: String,
    resume: Resume,
    backoff: Backoff,
    client: Client<Inboxes>,
    events: mpsc::Sender<Event>,
    stopped: watch::Receiver<bool>,
    /// A connection that lasted this long starts the backoff over.
    stable: Duration,
}

/// How a connection ended.
enum Ended {
    Stopped,
    Lost(String),
}

impl Run {
    async fn run(mut self) {
        let mut attempt: u32 = 0;
        loop {
            let began = Instant::now();
            let why = match self.connection().await {
                Ended::Stopped => return,
                Ended::Lost(why) => why,
            };
            if began.elapsed() >= self.stable {
                attempt = 0;
            }
            let retry_in = self.backoff.delay(attempt, backoff::random());
            attempt = attempt.saturating_add(1);
            if !self.tell(Event::Disconnected { why, retry_in }).await {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(retry_in) => {}
                () = stopped(&mut self.stopped) => return,
            }
        }
    }

    /// One connection, from connect to its end.
    async fn connection(&mut self) -> Ended {
        let separator = if self.url.contains('?') { '&' } else { '?' };
        let url = format!("{}{separator}{}", self.url, self.resume.query());
        let connecting = self.client.connect(ConnectRequest::new(url));
        let (mut socket, _) = tokio::select! {
            connected = connecting => match connected {
                Ok(connected) => connected,
                Err(error) => return Ended::Lost(error.to_string()),
            },
            () = stopped(&mut self.stopped) => return Ended::Stopped,
        };
        if !self.tell(Event::Connected).await {
            return close(&mut socket).await;
        }
        loop {
            let message = tokio::select! {
                message = socket.recv() => message,
                () = stopped(&mut self.stopped) => return close(&mut socket).await,
            };
            let text = match message {
                Some(Ok(OwnedMessage::Text(text))) => text,
                Some(Ok(OwnedMessage::Binary(_))) => continue,
                Some(Err(error)) => return Ended::Lost(error.to_string()),
                None => {
                    let why = match (socket.close_code(), socket.close_reason()) {
                        (Some(code), Some(reason)) if !reason.is_empty() => {
                            format!("closed by the bus: {} {reason}", code.0)
                        }
                        (Some(code), _) => format!("closed by the bus: {}", code.0),
                        (None, _) => "the connection ended".to_owned(),
                    };
                    return Ended::Lost(why);
                }
            };
            let Ok(incoming) = text.parse::<Incoming>() else {
                tracing::debug!(%text, "not a bus message: skipped");
                continue;
            };
            for event in self.resume.handle(incoming) {
                if !self.tell(event).await {
                    return close(&mut socket).await;
                }
            }
        }
    }

    /// Hands `event` to the application; `false` once it stopped
    /// listening.
    async fn tell(&mut self, event: Event) -> bool {
        tokio::select! {
            sent = self.events.send(event) => sent.is_ok(),
            () = stopped(&mut self.stopped) => false,
        }
    }
}

/// The client subscribers use unless given one: one for the process (a
/// client per subscriber would be a set of connection groups each).
fn shared_client() -> Client<Inboxes> {
    static SHARED: std::sync::OnceLock<Client<Inboxes>> = std::sync::OnceLock::new();
    SHARED
        .get_or_init(|| Client::new(crate::Config::default()))
        .clone()
}

/// Resolves once the subscriber is stopped (or dropped).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Closes with 1000 and waits for the close handshake, at most 2 s.
async fn close(socket: &mut crate::socket::WebSocket) -> Ended {
    if socket.close(CloseCode::NORMAL, "").is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while socket.recv().await.is_some() {}
        })
        .await;
    }
    Ended::Stopped
}
