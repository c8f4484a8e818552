//! Enough of an HTTP client to drive a control interface the way a test in any language
//! would: one request, raw bytes.

/// One HTTP/1.1 request with a JSON body to `addr`; the status and the JSON reply. Enough of
/// a client to drive a control interface the way a test in any language would.
pub fn http_json(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let (status, text) = http_raw(addr, method, path, None, body);
    let json =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

/// One raw HTTP/1.1 request, optionally with a bearer token; the status and the body text.
pub fn http_raw(
    addr: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<&serde_json::Value>,
) -> (u16, String) {
    use std::io::Write;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let mut stream = std::net::TcpStream::connect(addr).expect("the server answers");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request written");
    read_reply(stream)
}

/// `GET path` as HTTP/1.0, so that the server sends the body whole, never chunked (Go's
/// servers, Prometheus's among them, chunk larger HTTP/1.1 replies); the status and the body.
pub fn http_get_10(addr: &str, path: &str) -> (u16, String) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).expect("the server answers");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request written");
    read_reply(stream)
}

/// Sends `request` (a whole HTTP/1.x request that asks the server to close) to `addr`, over
/// TLS verified against `ca_file` when one is given, within `timeout` for the connection and
/// each read; the whole reply.
pub fn exchange(
    addr: &str,
    ca_file: Option<&std::path::Path>,
    request: &str,
    timeout: std::time::Duration,
) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let to: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| std::io::Error::other(format!("{addr} is not an address")))?;
    let mut tcp = std::net::TcpStream::connect_timeout(&to, timeout)?;
    tcp.set_read_timeout(Some(timeout))?;
    let mut reply = String::new();
    match ca_file {
        None => {
            tcp.write_all(request.as_bytes())?;
            tcp.read_to_string(&mut reply)?;
        }
        Some(ca) => {
            let trust = orbit_sdk::Trust::load(Some(ca)).map_err(std::io::Error::other)?;
            let name = rustls::pki_types::ServerName::try_from(to.ip().to_string())
                .map_err(std::io::Error::other)?;
            let conn = rustls::ClientConnection::new(trust.config(), name)
                .map_err(std::io::Error::other)?;
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            tls.write_all(request.as_bytes())?;
            tls.read_to_string(&mut reply)?;
        }
    }
    Ok(reply)
}

/// Reads a reply to its end (the server closes the connection): the status and the body.
fn read_reply(mut stream: std::net::TcpStream) -> (u16, String) {
    use std::io::Read;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("reply read");
    split_reply(&reply)
}

/// An HTTP reply's status and body.
pub fn split_reply(reply: &str) -> (u16, String) {
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, body.to_owned())
}
