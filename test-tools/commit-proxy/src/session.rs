//! One client connection: relay the handshake, then every command and its complete response,
//! applying armed rules to the statements they match.
//!
//! The session follows the protocol only as far as it must to know where each response ends:
//! OK, ERR, result sets (with or without EOF packets), multi-results, LOCAL INFILE and prepared
//! statements. On any command or state it does not understand it stops interpreting, flushes
//! what it holds, and pipes raw bytes both ways for the rest of the connection: it never
//! rewrites what it cannot parse. The only bytes it ever changes are capability bits in the
//! server's greeting (TLS and compression off, so the stream stays readable).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::classify::{classify, Kind, Statement};
use crate::packet::{
    err_packet, lenenc_value, read_packet, Packet, STATUS_IN_TRANS, STATUS_MORE_RESULTS,
};
use crate::rules::{Action, Fired, Matched};
use crate::state::Shared;

// Capability flags (the greeting's two 16-bit halves joined).
const CLIENT_MYSQL: u32 = 1;
const CLIENT_COMPRESS: u32 = 0x20;
const CLIENT_SSL: u32 = 0x800;
const CLIENT_PLUGIN_AUTH: u32 = 1 << 19;
const CLIENT_DEPRECATE_EOF: u32 = 1 << 24;
const CLIENT_OPTIONAL_RESULTSET_METADATA: u32 = 1 << 25;
const CLIENT_ZSTD: u32 = 1 << 26;
const CLIENT_QUERY_ATTRIBUTES: u32 = 1 << 27;
/// What the proxy takes out of the server's offer.
const STRIPPED: u32 = CLIENT_SSL
    | CLIENT_COMPRESS
    | CLIENT_ZSTD
    | CLIENT_QUERY_ATTRIBUTES
    | CLIENT_OPTIONAL_RESULTSET_METADATA;
/// MariaDB extended capabilities taken out: progress reports, bulk execution, cached metadata.
const MARIADB_STRIPPED: u32 = 1 | 4 | 16;

const STATUS_NO_BACKSLASH_ESCAPES: u16 = 0x0200;

const COM_QUIT: u8 = 0x01;
const COM_INIT_DB: u8 = 0x02;
const COM_QUERY: u8 = 0x03;
const COM_STATISTICS: u8 = 0x09;
const COM_PROCESS_KILL: u8 = 0x0C;
const COM_DEBUG: u8 = 0x0D;
const COM_PING: u8 = 0x0E;
const COM_STMT_PREPARE: u8 = 0x16;
const COM_STMT_EXECUTE: u8 = 0x17;
const COM_STMT_SEND_LONG_DATA: u8 = 0x18;
const COM_STMT_CLOSE: u8 = 0x19;
const COM_STMT_RESET: u8 = 0x1A;
const COM_SET_OPTION: u8 = 0x1B;
const COM_RESET_CONNECTION: u8 = 0x1F;

/// Authentication plugins whose exchange the session knows the turn-taking of.
const KNOWN_PLUGINS: &[&str] = &[
    "mysql_native_password",
    "caching_sha2_password",
    "sha256_password",
    "client_ed25519",
    "mysql_clear_password",
];

/// How a step ended.
enum Next {
    Continue,
    /// Close both sides (the fault, or the conversation, is over).
    Close {
        reset: bool,
    },
    /// Stop interpreting; pipe raw bytes from here on.
    Opaque,
}

/// Why interpretation stopped mid-response.
enum Stop {
    /// A socket failed or closed: the conversation is over.
    Io,
    /// Something the session does not understand; it has already been forwarded.
    Surprise,
}

impl From<io::Error> for Stop {
    fn from(_: io::Error) -> Self {
        Stop::Io
    }
}

type Step<T> = Result<T, Stop>;

struct Session {
    id: u64,
    shared: Arc<Shared>,
    client_r: BufReader<OwnedReadHalf>,
    client_w: BufWriter<OwnedWriteHalf>,
    server_r: BufReader<OwnedReadHalf>,
    server_w: BufWriter<OwnedWriteHalf>,
    /// Capabilities both sides agreed on.
    caps: u32,
    thread_id: u32,
    /// The last status flags the server reported.
    status: u16,
    /// Prepared statements by id: what their text does, and the start of the text.
    prepared: HashMap<u32, (Statement, String)>,
    last_prepared: Option<u32>,
}

/// Serves one client connection until either side closes.
pub(crate) async fn serve(id: u64, client: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let upstream = shared.upstream.clone();
    let server = match tokio::time::timeout(
        Duration::from_secs(10),
        TcpStream::connect(upstream.as_str()),
    )
    .await
    {
        Ok(Ok(s)) => s,
        outcome => {
            let why = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "no answer within 10 s".to_owned(),
            };
            // A server may answer a new connection with ERR instead of its greeting.
            let mut client = client;
            let err = err_packet(
                0,
                2003,
                "HY000",
                &format!("commit-proxy cannot reach upstream {upstream}: {why}"),
            );
            let _ = client.write_all(err.raw()).await;
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let mut session = Session {
        id,
        shared: shared.clone(),
        client_r: BufReader::with_capacity(64 * 1024, cr),
        client_w: BufWriter::with_capacity(64 * 1024, cw),
        server_r: BufReader::with_capacity(64 * 1024, sr),
        server_w: BufWriter::with_capacity(64 * 1024, sw),
        caps: 0,
        thread_id: 0,
        status: 0,
        prepared: HashMap::new(),
        last_prepared: None,
    };
    let next = match session.handshake().await {
        Ok(Next::Continue) => session.commands().await,
        other => other,
    };
    match next {
        Ok(Next::Opaque) | Err(Stop::Surprise) => {
            shared.set_interpreting(id, false);
            session.pipe().await;
        }
        Ok(Next::Close { reset }) => session.close(reset).await,
        Ok(Next::Continue) | Err(Stop::Io) => session.close(false).await,
    }
}

impl Session {
    async fn read_server(&mut self) -> Step<Packet> {
        read_packet(&mut self.server_r).await?.ok_or(Stop::Io)
    }

    async fn send_client(&mut self, p: &Packet) -> Step<()> {
        self.client_w.write_all(p.raw()).await?;
        Ok(())
    }

    async fn send_server(&mut self, p: &Packet) -> Step<()> {
        self.server_w.write_all(p.raw()).await?;
        self.server_w.flush().await?;
        Ok(())
    }

    /// Greeting (patched), the client's response, and the authentication exchange.
    async fn handshake(&mut self) -> Step<Next> {
        let Some(mut greeting) = read_packet(&mut self.server_r).await? else {
            return Ok(Next::Close { reset: false });
        };
        match greeting.first() {
            Some(0x0A) => {}
            Some(0xFF) => {
                self.send_client(&greeting).await?;
                return Ok(Next::Close { reset: false });
            }
            _ => {
                self.send_client(&greeting).await?;
                return Ok(Next::Opaque);
            }
        }
        let patched = {
            let p = greeting.first_payload_mut();
            let Some(v) = p.iter().position(|&b| b == 0) else {
                return self.forward_greeting_opaque(&greeting).await;
            };
            if p.len() < v + 32 {
                return self.forward_greeting_opaque(&greeting).await;
            }
            self.thread_id = u32::from_le_bytes([p[v + 1], p[v + 2], p[v + 3], p[v + 4]]);
            let lo = u16::from_le_bytes([p[v + 14], p[v + 15]]);
            let hi = u16::from_le_bytes([p[v + 19], p[v + 20]]);
            let caps = u32::from(lo) | u32::from(hi) << 16;
            let patched = caps & !STRIPPED;
            p[v + 14..v + 16].copy_from_slice(&(patched as u16).to_le_bytes());
            p[v + 19..v + 21].copy_from_slice(&((patched >> 16) as u16).to_le_bytes());
            if caps & CLIENT_MYSQL == 0 {
                let ext = u32::from_le_bytes([p[v + 28], p[v + 29], p[v + 30], p[v + 31]]);
                p[v + 28..v + 32].copy_from_slice(&(ext & !MARIADB_STRIPPED).to_le_bytes());
            }
            let mut plugin = None;
            if caps & CLIENT_PLUGIN_AUTH != 0 {
                let auth_len = usize::from(p[v + 21]);
                let start = v + 32 + auth_len.saturating_sub(8).max(13);
                if let Some(rest) = p.get(start..) {
                    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
                    plugin = Some(String::from_utf8_lossy(&rest[..end]).into_owned());
                }
            }
            (patched, plugin)
        };
        let (server_caps, plugin) = patched;
        self.shared.set_thread_id(self.id, self.thread_id);
        self.send_client(&greeting).await?;
        self.client_w.flush().await?;

        let Some(response) = read_packet(&mut self.client_r).await? else {
            return Ok(Next::Close { reset: false });
        };
        let payload = response.payload();
        if payload.len() < 4 {
            self.send_server(&response).await?;
            return Ok(Next::Opaque);
        }
        let client_caps = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
        if client_caps & CLIENT_SSL != 0 && payload.len() == 32 {
            // An SSLRequest although TLS was not offered: refuse clearly, never hang.
            let err = err_packet(
                response.last_seq().wrapping_add(1),
                1043,
                "08S01",
                "commit-proxy does not support TLS: connect without TLS (e.g. --skip-ssl, ssl-mode=DISABLED)",
            );
            self.send_client(&err).await?;
            return Ok(Next::Close { reset: false });
        }
        if client_caps & CLIENT_COMPRESS != 0 {
            self.send_server(&response).await?;
            return Ok(Next::Opaque);
        }
        self.caps = client_caps & server_caps;
        self.send_server(&response).await?;
        self.authenticate(plugin).await
    }

    async fn forward_greeting_opaque(&mut self, greeting: &Packet) -> Step<Next> {
        self.send_client(greeting).await?;
        Ok(Next::Opaque)
    }

    /// Relays the authentication exchange packet by packet until the server's OK or ERR. Who
    /// speaks next is known for the plugins in [`KNOWN_PLUGINS`]; any other goes opaque.
    async fn authenticate(&mut self, mut plugin: Option<String>) -> Step<Next> {
        let mut server_speaks = true;
        loop {
            if let Some(name) = &plugin {
                if !KNOWN_PLUGINS.contains(&name.as_str()) {
                    return Ok(Next::Opaque);
                }
            }
            if !server_speaks {
                let Some(p) = read_packet(&mut self.client_r).await? else {
                    return Ok(Next::Close { reset: false });
                };
                self.send_server(&p).await?;
                server_speaks = true;
                continue;
            }
            let p = self.read_server().await?;
            self.send_client(&p).await?;
            self.client_w.flush().await?;
            match p.first() {
                Some(0x00) => {
                    self.status = p.status().unwrap_or(0);
                    return Ok(Next::Continue);
                }
                Some(0xFF) => return Ok(Next::Close { reset: false }),
                Some(0xFE) => {
                    // AuthSwitchRequest: plugin name, then data; the client answers.
                    let payload = p.payload();
                    let rest = &payload[1..];
                    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
                    plugin = Some(String::from_utf8_lossy(&rest[..end]).into_owned());
                    server_speaks = false;
                }
                // caching_sha2_password: fast authentication succeeded, the OK follows.
                Some(0x01) if p.payload()[..] == [0x01, 0x03] => server_speaks = true,
                // More authentication data (full authentication, a public key): client's turn.
                Some(0x01) => server_speaks = false,
                _ => return Ok(Next::Opaque),
            }
        }
    }

    /// The command phase.
    async fn commands(&mut self) -> Step<Next> {
        loop {
            let Some(request) = read_packet(&mut self.client_r).await? else {
                return Ok(Next::Close { reset: false });
            };
            if request.seq() != 0 {
                self.send_server(&request).await?;
                return Ok(Next::Opaque);
            }
            let next = match request.first() {
                Some(COM_QUIT) => {
                    self.send_server(&request).await?;
                    Next::Close { reset: false }
                }
                Some(COM_QUERY) if !self.shared.rules.any_armed() => {
                    // Nothing armed: relay without reading the statement.
                    self.send_server(&request).await?;
                    self.results(0, None).await?;
                    Next::Continue
                }
                Some(COM_QUERY) => {
                    let payload = request.payload();
                    let text = String::from_utf8_lossy(&payload[1..]).into_owned();
                    let escapes = self.status & STATUS_NO_BACKSLASH_ESCAPES == 0;
                    let statements = classify(&text, escapes);
                    self.statement(&request, &statements, &text).await?
                }
                Some(COM_STMT_PREPARE) => {
                    let payload = request.payload();
                    let text = String::from_utf8_lossy(&payload[1..]).into_owned();
                    let statements =
                        classify(&text, self.status & STATUS_NO_BACKSLASH_ESCAPES == 0);
                    self.send_server(&request).await?;
                    let statement = match statements.as_slice() {
                        [one] => *one,
                        _ => Statement {
                            kind: Kind::Other,
                            chain: false,
                            release: false,
                            certain: true,
                        },
                    };
                    let head: String = text.chars().take(200).collect();
                    self.prepare_response(statement, head).await?;
                    Next::Continue
                }
                Some(COM_STMT_EXECUTE) => {
                    let payload = request.payload();
                    if payload.len() < 10 || payload[5] != 0 {
                        // Cursors (flags ≠ 0) fetch rows later: not followed here.
                        self.send_server(&request).await?;
                        return Ok(Next::Opaque);
                    }
                    let mut id =
                        u32::from_le_bytes([payload[1], payload[2], payload[3], payload[4]]);
                    if id == u32::MAX {
                        // MariaDB: "the statement prepared last".
                        id = self.last_prepared.unwrap_or(id);
                    }
                    let (statement, text) = match self.prepared.get(&id) {
                        Some((s, text)) => (vec![*s], format!("<prepared> {text}")),
                        None => (Vec::new(), "<prepared>".to_owned()),
                    };
                    self.statement(&request, &statement, &text).await?
                }
                Some(COM_STMT_CLOSE) => {
                    let payload = request.payload();
                    if payload.len() >= 5 {
                        let id =
                            u32::from_le_bytes([payload[1], payload[2], payload[3], payload[4]]);
                        self.prepared.remove(&id);
                    }
                    self.send_server(&request).await?;
                    Next::Continue
                }
                Some(COM_STMT_SEND_LONG_DATA) => {
                    self.send_server(&request).await?;
                    Next::Continue
                }
                Some(COM_RESET_CONNECTION) => {
                    self.prepared.clear();
                    self.last_prepared = None;
                    self.send_server(&request).await?;
                    self.single_reply().await?;
                    Next::Continue
                }
                Some(
                    COM_PING | COM_INIT_DB | COM_STMT_RESET | COM_SET_OPTION | COM_PROCESS_KILL
                    | COM_STATISTICS | COM_DEBUG,
                ) => {
                    self.send_server(&request).await?;
                    self.single_reply().await?;
                    Next::Continue
                }
                _ => {
                    self.send_server(&request).await?;
                    return Ok(Next::Opaque);
                }
            };
            match next {
                Next::Continue => {}
                other => return Ok(other),
            }
        }
    }

    async fn single_reply(&mut self) -> Step<()> {
        let p = self.read_server().await?;
        if p.is_ok() {
            self.status = p.status().unwrap_or(self.status);
        }
        self.send_client(&p).await?;
        self.client_w.flush().await?;
        Ok(())
    }

    async fn relay_one(&mut self) -> Step<Packet> {
        let p = self.read_server().await?;
        self.send_client(&p).await?;
        Ok(p)
    }

    /// PREPARE_OK and its parameter and column definitions, or an ERR.
    async fn prepare_response(&mut self, statement: Statement, text: String) -> Step<()> {
        let first = self.relay_one().await?;
        if first.is_err() {
            self.client_w.flush().await?;
            return Ok(());
        }
        let payload = first.payload();
        if first.first() != Some(0x00) || payload.len() < 12 {
            self.client_w.flush().await?;
            return Err(Stop::Surprise);
        }
        let id = u32::from_le_bytes([payload[1], payload[2], payload[3], payload[4]]);
        let columns = u16::from_le_bytes([payload[5], payload[6]]);
        let params = u16::from_le_bytes([payload[7], payload[8]]);
        let eof = self.caps & CLIENT_DEPRECATE_EOF == 0;
        for group in [params, columns] {
            for _ in 0..group {
                self.relay_one().await?;
            }
            if group > 0 && eof {
                self.relay_one().await?;
            }
        }
        self.client_w.flush().await?;
        self.prepared.insert(id, (statement, text));
        self.last_prepared = Some(id);
        Ok(())
    }

    /// A COM_QUERY or COM_STMT_EXECUTE: find the first statement an armed rule matches, and
    /// forward, answer or cut as that rule says.
    async fn statement(
        &mut self,
        request: &Packet,
        statements: &[Statement],
        text: &str,
    ) -> Step<Next> {
        let found = statements.iter().enumerate().find_map(|(i, s)| {
            self.shared
                .rules
                .matching(self.id, s.kind, s.certain, text)
                .map(|m| (i, *s, m))
        });
        let Some((index, statement, matched)) = found else {
            self.send_server(request).await?;
            self.results(0, None).await?;
            return Ok(Next::Continue);
        };
        let (connection, server_thread_id) = (self.id, self.thread_id);
        let fired = |reply: Option<&Packet>, before: u16| Fired {
            seq: 0,
            rule: matched.id,
            action: matched.action.name(),
            connection,
            server_thread_id,
            statement: statement.kind.as_str(),
            text: text.chars().take(200).collect(),
            reply: match reply {
                Some(p) if p.is_err() => "err",
                Some(_) => "ok",
                None => "none",
            },
            error_number: reply.and_then(Packet::error_number),
            status_before: before,
            status_after: reply.and_then(Packet::status),
            in_transaction_before: before & STATUS_IN_TRANS != 0,
            in_transaction_after: reply
                .and_then(Packet::status)
                .map(|s| s & STATUS_IN_TRANS != 0),
            at_ms: 0,
        };
        let Matched { id, action } = &matched;
        match action {
            Action::DropCommitRequest | Action::Reset => {
                if !self.shared.rules.take(*id) {
                    return self.pass(request).await;
                }
                self.shared.rules.record(fired(None, self.status));
                Ok(Next::Close {
                    reset: matches!(action, Action::Reset),
                })
            }
            Action::Error { .. } => {
                if !self.shared.rules.take(*id) {
                    return self.pass(request).await;
                }
                let (number, state, message) = action.error_fields().expect("an error action");
                let err = err_packet(request.last_seq().wrapping_add(1), number, &state, &message);
                self.send_client(&err).await?;
                self.client_w.flush().await?;
                self.shared.rules.record(fired(Some(&err), self.status));
                Ok(Next::Continue)
            }
            Action::Delay { delay_ms } => {
                self.send_server(request).await?;
                self.client_w.flush().await?;
                let first = self.read_server().await?;
                if self.shared.rules.take(*id) {
                    self.shared.rules.record(fired(Some(&first), self.status));
                    tokio::time::sleep(Duration::from_millis(*delay_ms)).await;
                }
                self.finish_results(first, 0).await?;
                Ok(Next::Continue)
            }
            Action::HoldRequest { delay_ms } => {
                if self.shared.rules.take(*id) {
                    self.shared.rules.record(fired(None, self.status));
                    tokio::time::sleep(Duration::from_millis(*delay_ms)).await;
                }
                self.pass(request).await
            }
            Action::DropCommitOk => {
                self.send_server(request).await?;
                let Some(reply) = self.results(0, Some(index)).await? else {
                    return Ok(Next::Continue);
                };
                let before = self.status;
                let after = reply.status();
                // A version-gated COMMIT counts only if the server really ended a transaction.
                let confirmed = statement.certain
                    || (before & STATUS_IN_TRANS != 0
                        && after.is_some_and(|s| s & STATUS_IN_TRANS == 0));
                if reply.is_ok() && confirmed && self.shared.rules.take(*id) {
                    self.client_w.flush().await?;
                    self.shared.rules.record(fired(Some(&reply), before));
                    return Ok(Next::Close { reset: false });
                }
                self.finish_results(reply, index).await?;
                Ok(Next::Continue)
            }
        }
    }

    async fn pass(&mut self, request: &Packet) -> Step<Next> {
        self.send_server(request).await?;
        self.results(0, None).await?;
        Ok(Next::Continue)
    }

    /// Relays the results of one command, numbering them from `index`. With `intercept`,
    /// stops at that result's first packet and returns it unsent.
    async fn results(
        &mut self,
        mut index: usize,
        intercept: Option<usize>,
    ) -> Step<Option<Packet>> {
        loop {
            let first = self.read_server().await?;
            if intercept == Some(index) {
                self.client_w.flush().await?;
                return Ok(Some(first));
            }
            if !self.result(first).await? {
                self.client_w.flush().await?;
                return Ok(None);
            }
            index += 1;
        }
    }

    /// Relays result `index` starting at `first`, then the rest of the command's results.
    async fn finish_results(&mut self, first: Packet, index: usize) -> Step<()> {
        if self.result(first).await? {
            self.results(index + 1, None).await?;
        } else {
            self.client_w.flush().await?;
        }
        Ok(())
    }

    /// Relays one result starting at `first`; true if another result follows.
    async fn result(&mut self, first: Packet) -> Step<bool> {
        let mut first = first;
        loop {
            match first.first() {
                Some(0x00) if first.is_ok() => {
                    let status = first.status().unwrap_or(self.status);
                    self.status = status;
                    self.send_client(&first).await?;
                    return Ok(status & STATUS_MORE_RESULTS != 0);
                }
                Some(0xFF) => {
                    self.send_client(&first).await?;
                    return Ok(false);
                }
                Some(0xFB) => {
                    // LOCAL INFILE: the client sends the file, ending with an empty packet;
                    // then the server answers.
                    self.send_client(&first).await?;
                    self.client_w.flush().await?;
                    loop {
                        let Some(p) = read_packet(&mut self.client_r).await? else {
                            return Err(Stop::Io);
                        };
                        self.server_w.write_all(p.raw()).await?;
                        if p.payload_len() == 0 {
                            break;
                        }
                    }
                    self.server_w.flush().await?;
                    first = self.read_server().await?;
                }
                Some(_) => {
                    let Some(columns) = lenenc_value(&first.payload()) else {
                        self.send_client(&first).await?;
                        return Err(Stop::Surprise);
                    };
                    self.send_client(&first).await?;
                    for _ in 0..columns {
                        self.relay_one().await?;
                    }
                    if self.caps & CLIENT_DEPRECATE_EOF == 0 {
                        self.relay_one().await?;
                    }
                    loop {
                        let row = self.relay_one().await?;
                        if row.is_err() {
                            return Ok(false);
                        }
                        if row.is_terminator() {
                            let status = row.status().unwrap_or(self.status);
                            self.status = status;
                            return Ok(status & STATUS_MORE_RESULTS != 0);
                        }
                    }
                }
                None => {
                    self.send_client(&first).await?;
                    return Err(Stop::Surprise);
                }
            }
        }
    }

    /// Raw bytes both ways until either side closes.
    async fn pipe(self) {
        let Session {
            mut client_r,
            mut client_w,
            mut server_r,
            mut server_w,
            ..
        } = self;
        let _ = client_w.flush().await;
        let _ = server_w.flush().await;
        let mut client_w = client_w.into_inner();
        let mut server_w = server_w.into_inner();
        let up = async {
            let _ = tokio::io::copy(&mut client_r, &mut server_w).await;
            let _ = server_w.shutdown().await;
        };
        let down = async {
            let _ = tokio::io::copy(&mut server_r, &mut client_w).await;
            let _ = client_w.shutdown().await;
        };
        tokio::join!(up, down);
    }

    /// Closes both sides; with `reset`, the client sees a TCP reset instead of a clean close.
    async fn close(self, reset: bool) {
        let Session {
            client_r,
            mut client_w,
            server_r,
            server_w,
            ..
        } = self;
        let _ = client_w.flush().await;
        if let Ok(client) = client_r.into_inner().reunite(client_w.into_inner()) {
            if reset {
                // A zero linger makes close send RST at once; only a non-zero linger can block
                // on drop, which is why tokio deprecates the method.
                #[allow(deprecated)]
                let _ = client.set_linger(Some(Duration::ZERO));
            }
            drop(client);
        }
        drop(server_r);
        drop(server_w);
    }
}
