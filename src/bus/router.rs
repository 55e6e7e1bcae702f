//! [`Bus::router`]: the bus's routes on axum, served as the standalone
//! servers serve them (the same limits, tokens and answers).

use ::axum::Router;
use ::axum::body::Body;
use ::axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use ::axum::response::Response;
use ::axum::routing::any;

use super::Bus;
use super::http::{Answer, Call};
use crate::axum::WebSocketUpgrade;
use crate::connection::config::Config;
use crate::connection::handler::HttpResponse;

impl Bus {
    /// The bus's routes as an axum router to merge into an app's (or nest
    /// under a prefix): the WebSocket at the bus's path (`/ws`),
    /// `/publish`, `/publish/<topic>`, `/topics/<topic>` and `/stats`.
    /// `config` is the WebSockets' (served as axum's upgrades are: in the
    /// tokio groups over plain TCP, else by the stream driver);
    /// its `max_http_body_size` bounds a publish's body (413 past it).
    ///
    /// ```no_run
    /// use rapidws::bus::Bus;
    /// use rapidws::pubsub::PubSub;
    ///
    /// # async fn run() -> std::io::Result<()> {
    /// let bus = Bus::builder(PubSub::new()).build();
    /// let app = axum::Router::new()
    ///     .route("/", axum::routing::get(|| async { "hello" }))
    ///     .merge(bus.router(rapidws::Config::default()));
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:9004").await?;
    /// axum::serve(listener, app).await
    /// # }
    /// ```
    pub fn router<S>(&self, config: Config) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let limit = config.max_http_body_size;
        let server = crate::stream::Server::new(self.clone(), config);
        let upgrade = move |upgrade: Option<WebSocketUpgrade>| {
            let server = server.clone();
            async move {
                match upgrade {
                    Some(upgrade) => upgrade.serve(&server),
                    None => plain(426, "this is a WebSocket endpoint: upgrade to subscribe"),
                }
            }
        };
        let bus = self.clone();
        let http = move |method: Method, uri: Uri, headers: HeaderMap, body: Body| {
            let bus = bus.clone();
            async move { bus.answer_axum(method, uri, headers, body, limit).await }
        };
        Router::new()
            .route(&self.inner.path, any(upgrade))
            .route("/publish", any(http.clone()))
            .route("/publish/{*topic}", any(http.clone()))
            .route("/topics/{*topic}", any(http.clone()))
            .route("/stats", any(http))
    }

    async fn answer_axum(
        &self,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        body: Body,
        limit: usize,
    ) -> Response {
        let Ok(body) = ::axum::body::to_bytes(body, limit).await else {
            let why = format!("the body is over {limit} bytes, the largest publish here");
            return plain(413, &why);
        };
        let authorization = headers
            .get(::axum::http::header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        let call = Call {
            method: method.as_str(),
            path: uri.path(),
            query: uri.query().unwrap_or(""),
            authorization,
            body: &body,
        };
        match self.inner.answer(&call) {
            Answer::Done(response) => convert(response),
            Answer::Upgrade | Answer::Other => convert(self.inner.not_found()),
        }
    }
}

/// The bus's answer as axum's.
fn convert(answer: HttpResponse) -> Response {
    let mut response = Response::new(Body::from(answer.body().to_vec()));
    *response.status_mut() =
        StatusCode::from_u16(answer.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let fields = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(answer.content_type()) {
        fields.insert(::axum::http::header::CONTENT_TYPE, value);
    }
    for (name, value) in answer.headers() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            fields.append(name, value);
        }
    }
    response
}

/// A one-line plain-text answer.
fn plain(status: u16, why: &str) -> Response {
    convert(HttpResponse::text(status, format!("{why}\n")))
}
