//! Encryption at rest (issue 41): on a server started with the settings docs/recovery.md gives
//! (MariaDB's `file_key_management` plugin, encrypted tablespaces, redo log, temporary tables
//! and files), nothing the receiver stores can be read from the server's files; on a plain
//! server it can, which shows that the search would find it. A hot backup of an encrypted
//! server is encrypted too, and restores with the key. The storage suite itself runs on
//! such a server as the `storage-encrypted` variant of `make integration`.

use std::path::{Path, PathBuf};

use fixtures::{EventSpec, QUEUE};
use result_inbox::store::StoreOptions;
use result_inbox::{ConsumerName, Dsn, Outcome, QueueId, Store};
use sqlx::{Connection, MySqlConnection};
use testdb::Server;

/// Every file under `dir` (recursively) whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// On `server`: the receiver's tables made as `init` makes them, then two versions of one
/// task applied through the real store, each result carrying a marker (the first is then
/// overwritten in the view, so it lives on in the undo log too), and a bulk of further events
/// (so that pages are flushed and the redo log turns over). Then a clean, slow shutdown:
/// everything is in the server's files. A hot backup is taken before the shutdown. Returns the
/// files of its datadir, its temporary directory and the prepared backup that hold either
/// marker, whether InnoDB reported the receiver's tables encrypted while it ran, the backup,
/// and the receiver database's name.
async fn files_with_markers(
    server: &Server,
    markers: [&str; 2],
) -> (Vec<PathBuf>, bool, testdb::Backup, String) {
    let db = server.provision().await.expect("provisioned");
    fixtures::initialise(&db).await;
    let store = Store::connect(
        &Dsn::parse(db.runtime_url().expose()).unwrap(),
        ConsumerName::new("task-result-view").unwrap(),
        QueueId::new(QUEUE).unwrap(),
        StoreOptions::default(),
    )
    .await
    .expect("the store connects");
    for (version, marker) in (1..).zip(markers) {
        let result = format!(r#"{{"note":"{marker}","version":{version}}}"#);
        let event = EventSpec::succeeded(&format!("evt-m{version}"), "task-m", version, &result);
        assert_eq!(store.apply(&event.event()).await.unwrap(), Outcome::Applied);
    }
    for i in 0..300 {
        let event = EventSpec::succeeded(&format!("evt-b{i}"), &format!("task-b{i}"), 1, "{}");
        store.apply(&event.event()).await.unwrap();
    }
    let mut admin = MySqlConnection::connect(db.admin_receiver_url().expose())
        .await
        .unwrap();
    let plain: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.INNODB_TABLESPACES_ENCRYPTION \
         WHERE NAME IN (CONCAT(DATABASE(), '/receiver_inbox'), CONCAT(DATABASE(), '/receiver_task_views')) \
         AND ENCRYPTION_SCHEME = 1",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    drop(admin);
    drop(store);
    let backup = server.backup().expect("a hot backup");
    server.shut_down().expect("a clean shutdown");
    let dir = server.directory().expect("a local server's directory");
    let mut found = Vec::new();
    for place in [
        dir.join("data"),
        dir.join("tmp"),
        backup.dir().to_path_buf(),
    ] {
        for marker in markers {
            found.extend(files_holding(&place, marker.as_bytes()));
        }
    }
    found.sort();
    found.dedup();
    (found, plain == 2, backup, db.receiver_db.clone())
}

/// The markers of one run: made of the run's process id, so that no earlier file holds them.
fn markers() -> [String; 2] {
    let pid = std::process::id();
    [
        format!("secret-marker-{pid}-a"),
        format!("secret-marker-{pid}-b"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_in_a_result_is_found_in_a_plain_servers_files() {
    let server = Server::local().expect("a local server");
    let [a, b] = markers();
    let (found, encrypted, backup, _) = files_with_markers(&server, [&a, &b]).await;
    assert!(!encrypted, "a plain server reported encrypted tables");
    assert!(
        found.iter().any(|f| !f.starts_with(backup.dir())),
        "the markers were not found in any file of a plain server: the search would prove nothing"
    );
    assert!(
        found.iter().any(|f| f.starts_with(backup.dir())),
        "the markers were not found in a plain server's backup: its search would prove nothing"
    );
    let names: Vec<String> = found
        .iter()
        .map(|f| {
            let name = f.file_name().unwrap().to_string_lossy();
            match f.starts_with(backup.dir()) {
                true => format!("the backup's {name}"),
                false => name.into_owned(),
            }
        })
        .collect();
    fixtures::note(
        "at_rest",
        format_args!("plain server: the markers are in {}", names.join(", ")),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_in_a_result_is_in_no_file_of_an_encrypted_server() {
    let server = Server::local_encrypted().expect("an encrypted local server");
    assert!(server
        .description()
        .ends_with(&format!("{})", testdb::ENCRYPTED_NOTE)));
    let [a, b] = markers();
    let (found, encrypted, backup, database) = files_with_markers(&server, [&a, &b]).await;
    assert!(
        encrypted,
        "InnoDB did not report the receiver's tables encrypted"
    );
    assert!(
        found.is_empty(),
        "a marker written in a result can be read from the encrypted server's files or its backup: {found:?}"
    );
    fixtures::note(
        "at_rest",
        format_args!(
            "encrypted server: the markers are in no file of its datadir, its temporary directory or its hot backup"
    ),
    );
    // The encrypted backup restores, with the key, onto a server that reads it back.
    let restored = Server::restore(&backup).expect("the encrypted backup restores");
    let mut admin = MySqlConnection::connect(restored.admin_url_on(Some(&database)).expose())
        .await
        .unwrap();
    let result: Vec<u8> =
        sqlx::query_scalar("SELECT last_result FROM receiver_task_views WHERE task_id = 'task-m'")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(
        String::from_utf8_lossy(&result).contains(&b),
        "the restored view does not hold the newest result"
    );
}
