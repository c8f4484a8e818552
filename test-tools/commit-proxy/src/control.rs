//! The HTTP control interface: JSON over plain HTTP/1.1 on loopback, so a test suite in any
//! language can arm and disarm rules and read what fired with nothing but an HTTP client.
//!
//! | method and path | does |
//! |---|---|
//! | `GET /health` | `{"status":"ok","listening":…,"upstream":…}` |
//! | `GET /rules` | the armed rules with `hits`, `fired`, `remaining` |
//! | `POST /rules` | arms a rule from a JSON spec; `201` with the rule (its `id`) |
//! | `DELETE /rules/{id}` | disarms one; `200` with its final state, `404` if unknown |
//! | `DELETE /rules` | disarms all; `{"disarmed":n}` |
//! | `GET /events?after=N&rule=ID&wait_ms=MS` | firings after seq `N` (of rule `ID`); waits up to `MS` (≤ 60000) for one |
//! | `GET /connections` | open client connections with their server thread ids |
//!
//! Errors are `{"error":"…"}` with 400, 404, 405 or 413. Each request is answered and the
//! connection closed (`Connection: close`). This is deliberately small, written here, not a
//! web framework: a test tool's control plane should build in seconds and have nothing to
//! configure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::rules::RuleSpec;
use crate::state::Shared;

const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 64 * 1024;
const MAX_WAIT: Duration = Duration::from_secs(60);

pub(crate) struct Control {
    pub(crate) shared: Arc<Shared>,
    pub(crate) listen: SocketAddr,
}

struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    body: Vec<u8>,
}

struct Response {
    status: u16,
    body: Value,
}

fn error(status: u16, message: impl Into<String>) -> Response {
    Response {
        status,
        body: json!({ "error": message.into() }),
    }
}

fn ok(body: Value) -> Response {
    Response { status: 200, body }
}

impl Control {
    pub(crate) async fn serve(self, listener: TcpListener) {
        let this = Arc::new(self);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let this = this.clone();
            tokio::spawn(async move { this.connection(stream).await });
        }
    }

    async fn connection(&self, mut stream: TcpStream) {
        let response = match read_request(&mut stream).await {
            Ok(request) => self.handle(request).await,
            Err(r) => r,
        };
        let body = response.body.to_string();
        let reason = match response.status {
            200 => "OK",
            201 => "Created",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            413 => "Payload Too Large",
            _ => "Error",
        };
        let head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            response.status,
            body.len() + 1
        );
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(body.as_bytes()).await;
        let _ = stream.write_all(b"\n").await;
        let _ = stream.shutdown().await;
    }

    async fn handle(&self, req: Request) -> Response {
        let rules = &self.shared.rules;
        let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        match (req.method.as_str(), segments.as_slice()) {
            ("GET", ["health"]) => ok(json!({
                "status": "ok",
                "listening": self.listen.to_string(),
                "upstream": self.shared.upstream,
            })),
            ("GET", ["rules"]) => ok(json!(rules.list())),
            ("POST", ["rules"]) => {
                let spec: RuleSpec = match serde_json::from_slice(&req.body) {
                    Ok(s) => s,
                    Err(e) => return error(400, format!("not a rule: {e}")),
                };
                if let Err(e) = spec.validate() {
                    return error(400, e.0);
                }
                let next = self.shared.next_connection_id();
                let info = rules.arm(spec, next);
                Response {
                    status: 201,
                    body: json!(info),
                }
            }
            ("DELETE", ["rules"]) => ok(json!({ "disarmed": rules.disarm_all() })),
            ("DELETE", ["rules", id]) => {
                match id.parse::<u64>().ok().and_then(|id| rules.disarm(id)) {
                    Some(info) => ok(json!(info)),
                    None => error(404, format!("no armed rule {id}")),
                }
            }
            ("GET", ["events"]) => {
                let param = |name: &str| {
                    req.query
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.as_str())
                };
                let number = |name: &str| -> Result<Option<u64>, Response> {
                    param(name)
                        .map(|v| {
                            v.parse::<u64>()
                                .map_err(|_| error(400, format!("{name} must be a number")))
                        })
                        .transpose()
                };
                let (after, rule, wait) = match (number("after"), number("rule"), number("wait_ms"))
                {
                    (Ok(a), Ok(r), Ok(w)) => (a.unwrap_or(0), r, w.unwrap_or(0)),
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return e,
                };
                let wait = Duration::from_millis(wait).min(MAX_WAIT);
                let events = if wait.is_zero() {
                    rules.events_after(after, rule)
                } else {
                    rules.wait_events(after, rule, wait).await
                };
                let next = events.last().map_or(after, |e| e.seq);
                ok(json!({ "events": events, "next": next }))
            }
            ("GET", ["connections"]) => ok(json!(self.shared.connection_list())),
            (_, ["health" | "rules" | "events" | "connections"]) | (_, ["rules", _]) => error(
                405,
                format!("{} is not allowed on {}", req.method, req.path),
            ),
            _ => error(404, format!("no such endpoint: {}", req.path)),
        }
    }
}

async fn read_request(stream: &mut TcpStream) -> Result<Request, Response> {
    let mut buf = Vec::with_capacity(1024);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(error(413, "request head over 16 KiB"));
        }
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| error(400, e.to_string()))?;
        if n == 0 {
            return Err(error(400, "connection closed before the request ended"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let (Some(method), Some(target)) = (first.next(), first.next()) else {
        return Err(error(400, "malformed request line"));
    };
    let mut length = 0usize;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                length = value
                    .trim()
                    .parse()
                    .map_err(|_| error(400, "malformed Content-Length"))?;
            }
        }
    }
    if length > MAX_BODY {
        return Err(error(413, "request body over 64 KiB"));
    }
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| error(400, e.to_string()))?;
        if n == 0 {
            return Err(error(400, "connection closed before the body ended"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query,
        body,
    })
}
