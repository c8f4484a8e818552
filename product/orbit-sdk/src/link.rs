//! The consumer's transport: text messages in and out of one stream connection. The real one
//! is a WebSocket ([`WsConnector`]); the consumer's unit tests drive the same loop over
//! in-memory channels, with paused time.

use std::future::Future;
use std::time::Duration;

use endpoint::tls::TlsProblem;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector as TlsConnector, MaybeTlsStream, WebSocketStream};

use crate::client::Client;
use orbit_wire::MessageError;

/// Why a stream connection could not be opened, or ended; the consumer reconnects after each
/// ([`crate::ConsumerEvent::Disconnected`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// Opening the connection failed: refused, TLS, an HTTP status instead of the upgrade.
    #[error("{0}")]
    Connect(String),
    /// Opening the connection took longer than the connect timeout.
    #[error("opening the stream took longer than {} ms", .0.as_millis())]
    ConnectTimeout(Duration),
    /// Sending or receiving on the open connection failed.
    #[error("{0}")]
    Transport(String),
    /// The platform closed the stream.
    #[error("the platform closed the stream")]
    Closed,
    /// The platform sent something that is not one of its messages.
    #[error("unexpected stream message: {0}")]
    Message(#[from] MessageError),
    /// Nothing came from the platform for three heartbeat periods.
    #[error("no message from the platform for three heartbeat periods")]
    Silent,
    /// An ACK was not answered within the ACK timeout.
    #[error("an ACK went unanswered")]
    AckUnanswered,
    /// The platform sent a message larger than any legal delivery.
    #[error("the platform sent a message of more than {MAX_MESSAGE_BYTES} bytes (a 512 KiB event and its envelope at most): closing the stream")]
    TooLarge,
}

/// The largest message the stream accepts from the platform: a 512 KiB event (the canonical
/// form's limit) and 64 KiB for its envelope, as the platform's own request limit. The
/// WebSocket library's default would hold up to 64 MiB in memory per message.
pub const MAX_MESSAGE_BYTES: usize = 576 * 1024;

/// A WebSocket error as the stream reports it: a TLS problem in the SDK's words, an oversized
/// message as [`StreamError::TooLarge`].
fn stream_error(e: &WsError, wrap: fn(String) -> StreamError) -> StreamError {
    if let WsError::Capacity(CapacityError::MessageTooLong { .. }) = e {
        return StreamError::TooLarge;
    }
    match TlsProblem::find(e) {
        Some(problem) => wrap(format!("TLS: {}", problem.describe())),
        None => wrap(e.to_string()),
    }
}

/// One open stream connection.
pub(crate) trait Link: Send {
    /// Sends one text message.
    fn send(&mut self, text: String) -> impl Future<Output = Result<(), StreamError>> + Send;
    /// The next text message, `None` once the peer closed, or why the connection broke.
    /// Cancel-safe: a message is never lost to a `select!` that picks another branch.
    fn recv(&mut self) -> impl Future<Output = Result<Option<String>, StreamError>> + Send;
    /// Closes the connection politely.
    fn close(&mut self) -> impl Future<Output = ()> + Send;
}

/// Opens stream connections.
pub(crate) trait Connector: Send + 'static {
    type Link: Link;
    /// One attempt; an error says why it failed.
    fn connect(&mut self) -> impl Future<Output = Result<Self::Link, StreamError>> + Send;
}

/// WebSocket connections to one stream URL, each attempt bounded by a timeout.
pub(crate) struct WsConnector {
    url: String,
    authorization: Option<HeaderValue>,
    timeout: Duration,
    /// The client's TLS configuration, for `wss`.
    tls: Option<TlsConnector>,
}

impl WsConnector {
    pub(crate) fn new(client: &Client, path: &str, timeout: Duration) -> WsConnector {
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {}", client.token().expose())).ok();
        if let Some(v) = authorization.as_mut() {
            v.set_sensitive(true);
        }
        WsConnector {
            url: client.base().ws(path),
            authorization,
            timeout,
            tls: client.trust().map(|t| TlsConnector::Rustls(t.config())),
        }
    }
}

impl Connector for WsConnector {
    type Link = WsLink;

    async fn connect(&mut self) -> Result<WsLink, StreamError> {
        let mut request = self
            .url
            .as_str()
            .into_client_request()
            .map_err(|e| StreamError::Connect(e.to_string()))?;
        if let Some(v) = &self.authorization {
            request.headers_mut().insert("Authorization", v.clone());
        }
        // No Nagle: an ACK is a small frame sent while the previous one may be unanswered,
        // and Nagle with the peer's delayed ACK would hold it back about 40 ms.
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let connect = tokio_tungstenite::connect_async_tls_with_config(
            request,
            Some(config),
            true,
            self.tls.clone(),
        );
        match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok((ws, _))) => Ok(WsLink(ws)),
            Ok(Err(e)) => Err(stream_error(&e, StreamError::Connect)),
            Err(_) => Err(StreamError::ConnectTimeout(self.timeout)),
        }
    }
}

/// A WebSocket stream connection.
pub(crate) struct WsLink(WebSocketStream<MaybeTlsStream<TcpStream>>);

impl Link for WsLink {
    async fn send(&mut self, text: String) -> Result<(), StreamError> {
        self.0
            .send(Message::Text(text.into()))
            .await
            .map_err(|e| stream_error(&e, StreamError::Transport))
    }

    async fn recv(&mut self) -> Result<Option<String>, StreamError> {
        loop {
            match self.0.next().await {
                Some(Ok(Message::Text(t))) => return Ok(Some(t.as_str().to_owned())),
                Some(Ok(Message::Close(_))) | None => return Ok(None),
                // Pings, pongs and binary frames carry nothing for the consumer.
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(stream_error(&e, StreamError::Transport)),
            }
        }
    }

    async fn close(&mut self) {
        let _ = self.0.close(None).await;
    }
}
