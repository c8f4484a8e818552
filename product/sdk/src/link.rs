//! The consumer's transport: text messages in and out of one stream connection. The real one
//! is a WebSocket ([`WsConnector`]); the consumer's unit tests drive the same loop over
//! in-memory channels, with paused time.

use std::future::Future;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::client::Client;

/// One open stream connection.
pub(crate) trait Link: Send {
    /// Sends one text message.
    fn send(&mut self, text: String) -> impl Future<Output = Result<(), String>> + Send;
    /// The next text message, `None` once the peer closed, or why the connection broke.
    /// Cancel-safe: a message is never lost to a `select!` that picks another branch.
    fn recv(&mut self) -> impl Future<Output = Result<Option<String>, String>> + Send;
    /// Closes the connection politely.
    fn close(&mut self) -> impl Future<Output = ()> + Send;
}

/// Opens stream connections.
pub(crate) trait Connector: Send + 'static {
    type Link: Link;
    /// One attempt; an error says why it failed.
    fn connect(&mut self) -> impl Future<Output = Result<Self::Link, String>> + Send;
}

/// WebSocket connections to one stream URL, each attempt bounded by a timeout.
pub(crate) struct WsConnector {
    url: String,
    authorization: Option<HeaderValue>,
    timeout: Duration,
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
        }
    }
}

impl Connector for WsConnector {
    type Link = WsLink;

    async fn connect(&mut self) -> Result<WsLink, String> {
        let mut request = self
            .url
            .as_str()
            .into_client_request()
            .map_err(|e| e.to_string())?;
        if let Some(v) = &self.authorization {
            request.headers_mut().insert("Authorization", v.clone());
        }
        match tokio::time::timeout(self.timeout, tokio_tungstenite::connect_async(request)).await {
            Ok(Ok((ws, _))) => Ok(WsLink(ws)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "opening the stream took longer than {} ms",
                self.timeout.as_millis()
            )),
        }
    }
}

/// A WebSocket stream connection.
pub(crate) struct WsLink(WebSocketStream<MaybeTlsStream<TcpStream>>);

impl Link for WsLink {
    async fn send(&mut self, text: String) -> Result<(), String> {
        self.0
            .send(Message::Text(text.into()))
            .await
            .map_err(|e| e.to_string())
    }

    async fn recv(&mut self) -> Result<Option<String>, String> {
        loop {
            match self.0.next().await {
                Some(Ok(Message::Text(t))) => return Ok(Some(t.as_str().to_owned())),
                Some(Ok(Message::Close(_))) | None => return Ok(None),
                // Pings, pongs and binary frames carry nothing for the consumer.
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
    }

    async fn close(&mut self) {
        let _ = self.0.close(None).await;
    }
}
