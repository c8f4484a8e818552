//! commit-proxy as a product: other clients, TLS refusal, big packets, prepared COMMIT,
//! look-alikes, and the binary driven only through its control interface.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use commit_proxy::{Action, On, Proxy, RuleSpec};
use fixtures::{http_json, workspace_bin, EventSpec, ReceiverDb};
use result_inbox::{ApplyError, Outcome};
use serde_json::json;
use sqlx::{Connection, Executor, MySqlConnection, Row};

fn admin_url_via(rdb: &ReceiverDb, proxy: &Proxy) -> String {
    rdb.db
        .admin_receiver_url()
        .expose()
        .replace(rdb.db.address(), &proxy.local_addr().to_string())
}

#[tokio::test]
async fn refuses_to_listen_beyond_loopback() {
    let e = Proxy::start("0.0.0.0:0", "127.0.0.1:3306")
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "refusing to listen on 0.0.0.0:0: commit-proxy listens on loopback addresses only (127.0.0.1, ::1)"
    );
}

#[tokio::test]
async fn the_greeting_names_the_server_thread() {
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let mut conn = MySqlConnection::connect(&admin_url_via(&rdb, &proxy))
        .await
        .unwrap();
    let id: u64 = conn
        .fetch_one("SELECT CONNECTION_ID()")
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
    let listed = proxy.connections();
    assert_eq!(listed.len(), 1);
    assert_eq!(u64::from(listed[0].server_thread_id), id);
    assert!(listed[0].interpreting);
}

#[tokio::test]
async fn a_prepared_commit_is_recognised_and_look_alikes_are_not() {
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitOk).once())
        .unwrap();
    let mut conn = MySqlConnection::connect(&admin_url_via(&rdb, &proxy))
        .await
        .unwrap();
    conn.execute("CREATE TABLE commit_log (x INT PRIMARY KEY)")
        .await
        .unwrap();
    for look_alike in [
        "SELECT 'COMMIT'",
        "/* COMMIT */ SELECT 1",
        "SELECT COUNT(*) FROM commit_log",
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    ] {
        conn.execute(look_alike).await.unwrap();
    }
    // sqlx's nested transaction commits with RELEASE SAVEPOINT: not a COMMIT.
    let mut outer = conn.begin().await.unwrap();
    let mut inner = outer.begin().await.unwrap();
    inner
        .execute("INSERT INTO commit_log VALUES (1)")
        .await
        .unwrap();
    inner.commit().await.unwrap();
    assert_eq!(rule.info().unwrap().hits, 0, "no look-alike matched");
    // `sqlx::query` prepares: COM_STMT_PREPARE "COMMIT", then COM_STMT_EXECUTE.
    let committed = sqlx::query("COMMIT").execute(&mut *outer).await;
    assert!(committed.is_err(), "the OK was dropped");
    drop(outer);
    let fired = rule.fired_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(fired.text, "<prepared> COMMIT");
    assert_eq!(fired.in_transaction_after, Some(false));
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM commit_log").await, 1);
}

// Blocking I/O below: the proxy needs a worker of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mariadb_command_line_client_loses_its_commit_ok() {
    let client = ["mariadb", "mysql"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
        .expect("the mariadb client is installed with mariadb-server");
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let rule = proxy.arm(RuleSpec::new(Action::DropCommitOk)).unwrap();
    let out = Command::new(client)
        .args([
            "--protocol=TCP",
            "-h127.0.0.1",
            &format!("-P{}", proxy.local_addr().port()),
            &format!("-u{}", rdb.db.runtime.user),
            &rdb.db.receiver_db,
            "-e",
            "BEGIN; INSERT INTO receiver_inbox VALUES ('cli', 'q', 'evt-cli', UNHEX(SHA2('x', 256)), 'x', 0, UTC_TIMESTAMP(6)); COMMIT;",
        ])
        .env("MYSQL_PWD", rdb.db.runtime.password.expose())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("Lost connection") || stderr.contains("2013"),
        "{stderr}"
    );
    assert_eq!(rule.firings().len(), 1);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id = 'evt-cli'")
            .await,
        1,
        "committed although the client never heard"
    );
}

// Blocking I/O below: the proxy needs a worker of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_demanding_tls_fails_fast_and_clearly() {
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;

    // A raw client that sends an SSLRequest anyway gets an ERR packet, then the close.
    let started = Instant::now();
    let mut s = std::net::TcpStream::connect(proxy.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut header = [0u8; 4];
    s.read_exact(&mut header).unwrap();
    let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
    let mut greeting = vec![0u8; len];
    s.read_exact(&mut greeting).unwrap();
    let nul = greeting.iter().position(|&b| b == 0).unwrap();
    let caps_lo = u16::from_le_bytes([greeting[nul + 14], greeting[nul + 15]]);
    assert_eq!(caps_lo & 0x0800, 0, "TLS is not offered");
    assert_eq!(caps_lo & 0x0020, 0, "compression is not offered");
    let mut ssl_request = vec![32, 0, 0, 1];
    let caps: u32 = 0x0800 | 0x0200 | 0x8000 | 0x0008_0000;
    ssl_request.extend_from_slice(&caps.to_le_bytes());
    ssl_request.extend_from_slice(&[0, 0, 0, 1, 45]);
    ssl_request.extend_from_slice(&[0u8; 23]);
    s.write_all(&ssl_request).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(reply[3], 2, "the ERR carries the next sequence id");
    assert_eq!(reply[4], 0xFF);
    let text = String::from_utf8_lossy(&reply[7..]);
    assert!(text.contains("commit-proxy does not support TLS"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // The mariadb client told to require TLS refuses at once, naming the reason.
    let out = Command::new("mariadb")
        .args([
            "--protocol=TCP",
            "-h127.0.0.1",
            &format!("-P{}", proxy.local_addr().port()),
            "-uroot",
            "--ssl",
            "--ssl-verify-server-cert",
            "-e",
            "SELECT 1",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.to_lowercase().contains("ssl"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_twenty_mib_statement_and_reply_relay_intact() {
    let rdb = ReceiverDb::new().await;
    let mut admin = rdb.admin().await;
    // Global and only for new connections; other tests' connections keep their own.
    admin
        .execute("SET GLOBAL max_allowed_packet = 67108864")
        .await
        .unwrap();
    let proxy = rdb.proxy().await;
    let mut conn = MySqlConnection::connect(&admin_url_via(&rdb, &proxy))
        .await
        .unwrap();
    let size = 20 << 20;
    let text: String = (0..size).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let sql = format!(
        "SELECT CHAR_LENGTH('{text}'), SHA2('{text}', 256), REPEAT('xy', {})",
        size / 2
    );
    let row = conn.fetch_one(sql.as_str()).await.unwrap();
    let length: i64 = row.try_get(0).unwrap();
    assert_eq!(length, size as i64);
    let via: String = row.try_get(1).unwrap();
    assert_eq!(via, result_inbox::Digest::of(text.as_bytes()).to_hex());
    let big: String = row.try_get(2).unwrap();
    assert_eq!(big.len(), size);
    assert!(big
        .bytes()
        .enumerate()
        .all(|(i, b)| b == if i % 2 == 0 { b'x' } else { b'y' }));
    // Still interpreting after a multi-chunk packet each way.
    conn.execute("SELECT 1").await.unwrap();
    assert!(proxy.connections().iter().all(|c| c.interpreting));
}

#[tokio::test]
async fn delay_holds_a_reply_and_error_answers_any_statement() {
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let mut conn = MySqlConnection::connect(&admin_url_via(&rdb, &proxy))
        .await
        .unwrap();
    let mut slow = RuleSpec::new(Action::Delay { delay_ms: 300 })
        .on(On::Any)
        .once();
    slow.contains = Some("sleepy".into());
    let slow = proxy.arm(slow).unwrap();
    conn.execute("SELECT 1").await.unwrap();
    assert!(
        slow.firings().is_empty(),
        "only statements containing the text"
    );
    let started = Instant::now();
    conn.execute("SELECT 'sleepy'").await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?} {:?} {:?}",
        started.elapsed(),
        proxy.events(0),
        proxy.rules()
    );
    assert_eq!(slow.firings().len(), 1);

    proxy
        .arm(
            RuleSpec::new(Action::Error {
                number: 1205,
                sqlstate: None,
                message: None,
            })
            .on(On::Begin)
            .once(),
        )
        .unwrap();
    let e = conn.execute("START TRANSACTION").await.unwrap_err();
    let db = e.as_database_error().unwrap();
    assert_eq!(db.code().as_deref(), Some("HY000"));
    assert!(
        db.message().contains("Lock wait timeout"),
        "{}",
        db.message()
    );
    // The connection still works: the ERR carried the right sequence id.
    conn.execute("SELECT 2").await.unwrap();
}

/// `hold-request` holds the COMMIT itself: while it is held the server has not committed
/// (another connection does not see the row), unlike `delay`, which holds only the reply.
#[tokio::test]
async fn hold_request_holds_a_commit_before_the_server_sees_it() {
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let url = admin_url_via(&rdb, &proxy);
    let mut held = MySqlConnection::connect(&url).await.unwrap();
    let mut direct = MySqlConnection::connect(rdb.db.admin_receiver_url().expose())
        .await
        .unwrap();
    direct
        .execute("CREATE TABLE held_commit (id INT PRIMARY KEY)")
        .await
        .unwrap();
    let rule = proxy
        .arm(RuleSpec::new(Action::HoldRequest { delay_ms: 600 }).once())
        .unwrap();
    held.execute("BEGIN").await.unwrap();
    held.execute("INSERT INTO held_commit VALUES (1)")
        .await
        .unwrap();
    let started = Instant::now();
    let commit = tokio::spawn(async move {
        held.execute("COMMIT").await.unwrap();
        held
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM held_commit")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(seen, 0, "the COMMIT is still held: nothing committed");
    let _held = commit.await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(600));
    let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM held_commit")
        .fetch_one(&mut direct)
        .await
        .unwrap();
    assert_eq!(seen, 1, "committed once forwarded");
    assert_eq!(rule.firings().len(), 1);
}

#[tokio::test]
async fn the_binary_is_driven_through_its_control_interface() {
    let rdb = ReceiverDb::new().await;
    let mut cmd = Command::new(workspace_bin("commit-proxy"));
    cmd.args([
        "--upstream",
        rdb.db.address(),
        "--listen",
        "127.0.0.1:0",
        "--control",
        "127.0.0.1:0",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = fixtures::spawn(cmd);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = lines.next().unwrap().unwrap();
    let control = lines.next().unwrap().unwrap();
    let listen = listening
        .strip_prefix("listening=")
        .expect("first line")
        .to_owned();
    let control = control
        .strip_prefix("control=")
        .expect("second line")
        .to_owned();

    let (status, health) = http_json(&control, "GET", "/health", None);
    assert_eq!(status, 200);
    assert_eq!(health["listening"], json!(listen));
    let (status, rule) = http_json(
        &control,
        "POST",
        "/rules",
        Some(&json!({"action": "drop-commit-ok", "count": 1})),
    );
    assert_eq!(status, 201, "{rule}");
    let id = rule["id"].as_u64().unwrap();
    let (status, bad) = http_json(
        &control,
        "POST",
        "/rules",
        Some(&json!({"action": "drop-commit-ok", "on": "any"})),
    );
    assert_eq!(status, 400);
    assert_eq!(
        bad["error"],
        json!("drop-commit-ok applies to COMMIT only (on must be commit)")
    );

    // Nothing has fired yet: a bounded wait comes back empty.
    let (_, none) = http_json(&control, "GET", "/events?wait_ms=50", None);
    assert_eq!(none["events"], json!([]));

    let store = rdb.store_via(listen.parse().unwrap()).await;
    let event = EventSpec::cancelled("evt-bin", "task-bin", 1).event();
    assert!(matches!(
        store.apply(&event).await,
        Err(ApplyError::CommitUnconfirmed)
    ));

    let (status, events) = http_json(&control, "GET", "/events?after=0&wait_ms=5000", None);
    assert_eq!(status, 200);
    let fired = &events["events"][0];
    assert_eq!(fired["rule"], json!(id));
    assert_eq!(fired["action"], json!("drop-commit-ok"));
    assert_eq!(fired["reply"], json!("ok"));
    assert_eq!(fired["in_transaction_before"], json!(true));
    assert_eq!(fired["in_transaction_after"], json!(false));
    assert_eq!(events["next"], json!(1));

    let (_, rules) = http_json(&control, "GET", "/rules", None);
    assert_eq!(rules[0]["hits"], json!(1));
    assert_eq!(rules[0]["fired"], json!(1));
    assert_eq!(rules[0]["remaining"], json!(0));
    let (status, _) = http_json(&control, "DELETE", &format!("/rules/{id}"), None);
    assert_eq!(status, 200);
    let (status, _) = http_json(&control, "DELETE", &format!("/rules/{id}"), None);
    assert_eq!(status, 404);

    // Disarmed: the re-apply through the same proxy resolves the duplicate.
    assert_eq!(
        store.apply(&event).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );

    // SIGTERM stops it cleanly.
    sigterm(child.id());
    let status = fixtures::poll_blocking(Duration::from_secs(5), Duration::from_millis(20), || {
        child.try_wait().unwrap()
    })
    .expect("commit-proxy did not stop on SIGTERM");
    assert!(status.success(), "{status}");
}

#[test]
fn the_binary_explains_bad_flags_in_one_line() {
    let out = Command::new(workspace_bin("commit-proxy"))
        .args([
            "--upstream",
            "127.0.0.1:3306",
            "--rule",
            "drop-commit-ok@any",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "commit-proxy: rule \"drop-commit-ok@any\": drop-commit-ok applies to COMMIT only (on must be commit); see commit-proxy --help\n"
    );
    let out = Command::new(workspace_bin("commit-proxy"))
        .args(["--upstream", "127.0.0.1:3306", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    // A non-loopback address is a usage error, as docs/input-surfaces.md says.
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback addresses only"));
    for upstream in ["banana", "127.0.0.1", ":3306", "127.0.0.1:99999", "a b:1"] {
        let out = Command::new(workspace_bin("commit-proxy"))
            .args(["--upstream", upstream])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--upstream {upstream}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("commit-proxy: --upstream {upstream:?} has no")),
            "{err}"
        );
        assert!(err.contains("give HOST:PORT"), "{err}");
    }
}

fn sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Reads one packet (single chunk) from a blocking stream.
fn read_raw(s: &mut std::net::TcpStream) -> (u8, Vec<u8>) {
    let mut header = [0u8; 4];
    s.read_exact(&mut header).unwrap();
    let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).unwrap();
    (header[3], payload)
}

fn write_raw(s: &mut std::net::TcpStream, seq: u8, payload: &[u8]) {
    let mut p = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    p.push(seq);
    p.extend_from_slice(payload);
    s.write_all(&p).unwrap();
}

// Blocking I/O below: the proxy needs a worker of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_command_turns_the_connection_into_a_raw_pipe() {
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    proxy.arm(RuleSpec::new(Action::DropCommitOk)).unwrap();
    let mut s = std::net::TcpStream::connect(proxy.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    read_raw(&mut s);
    // Log in as root with the empty password: mysql_native_password with no auth data.
    let caps: u32 = 0x0200 | 0x8000 | 0x0008_0000 | 0x0001_0000 | 0x0002_0000 | 0x8;
    let mut response = caps.to_le_bytes().to_vec();
    response.extend_from_slice(&(1u32 << 24).to_le_bytes());
    response.push(45);
    response.extend_from_slice(&[0u8; 23]);
    response.extend_from_slice(b"root\0");
    response.push(0);
    response.extend_from_slice(rdb.db.receiver_db.as_bytes());
    response.push(0);
    response.extend_from_slice(b"mysql_native_password\0");
    write_raw(&mut s, 1, &response);
    let (_, ok) = read_raw(&mut s);
    assert_eq!(ok[0], 0x00, "logged in");
    assert!(proxy.connections()[0].interpreting);

    // COM_FIELD_LIST (deprecated, not followed by the proxy): relayed, then raw bytes.
    let mut field_list = vec![0x04];
    field_list.extend_from_slice(b"receiver_inbox\0");
    write_raw(&mut s, 0, &field_list);
    let mut columns = 0;
    loop {
        let (_, p) = read_raw(&mut s);
        if p[0] == 0xFE && p.len() < 9 {
            break;
        }
        assert_ne!(p[0], 0xFF, "{}", String::from_utf8_lossy(&p));
        columns += 1;
    }
    assert_eq!(columns, 7, "the inbox's columns came through");
    assert!(!proxy.connections()[0].interpreting);

    // A COMMIT on a raw pipe is relayed untouched: the armed rule no longer applies.
    write_raw(&mut s, 0, b"\x03COMMIT");
    let (seq, ok) = read_raw(&mut s);
    assert_eq!((seq, ok[0]), (1, 0x00));
}
