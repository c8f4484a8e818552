//! Embedding the inbox core in a service of your own: each event is recorded in the inbox,
//! moves its task's view, and writes a row of the service's own table, all in one
//! transaction. No platform SDK is involved; how the events arrive is the service's business.
//!
//! ```text
//! cargo run -p result-inbox --example embed -- 'mysql://user:pass@127.0.0.1:3306/db' QUEUE < events.jsonl
//! ```
//!
//! The database must hold the receiver's two tables (`receiver init`, or
//! `result_inbox::schema::init`) and the service's own table, made by the service's own
//! migration:
//!
//! ```sql
//! CREATE TABLE customer_notices (task_id VARBINARY(128) NOT NULL,
//!   task_version BIGINT UNSIGNED NOT NULL, state VARCHAR(32) NOT NULL,
//!   PRIMARY KEY (task_id, task_version)) ENGINE=InnoDB;
//! ```
//!
//! It reads one event per line from standard input and prints one line per event:
//! `event=<id> outcome=<applied|stale|duplicate>` or `event=<id> error=<kind>`. Only a printed
//! outcome would let a real service ACK the event.

use std::io::BufRead;
use std::process::ExitCode;

use result_inbox::{
    BusinessWrite, ConsumerName, Dsn, Outcome, QueueId, Receipt, Store, StoreOptions, TaskEvent,
    WriteFuture,
};
use sqlx::MySqlConnection;

/// The service's own table: one notice per task state it tells a customer about.
const INSERT_NOTICE: &str =
    "INSERT INTO customer_notices (task_id, task_version, state) VALUES (?, ?, ?)";

/// The service's write: runs inside the apply's transaction, after the view moved and before
/// COMMIT. If it fails, the inbox row and the view change roll back with it, and the event
/// can be delivered again.
struct Notify;

impl BusinessWrite for Notify {
    fn write<'a>(&'a self, conn: &'a mut MySqlConnection, receipt: Receipt<'a>) -> WriteFuture<'a> {
        Box::pin(async move {
            // An older version is history only: tell nobody about it.
            if receipt.outcome != Outcome::Applied {
                return Ok(());
            }
            sqlx::query(INSERT_NOTICE)
                .bind(receipt.event.task().as_str().as_bytes())
                .bind(receipt.event.version())
                .bind(receipt.event.state().as_str())
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dsn, queue] = args.as_slice() else {
        eprintln!("usage: embed <mysql-url-with-database> <queue> < events.jsonl");
        return ExitCode::from(2);
    };
    let (dsn, queue) = match (Dsn::parse(dsn), QueueId::new(queue.clone())) {
        (Ok(d), Ok(q)) => (d, q),
        (Err(e), _) => {
            eprintln!("embed: the database URL {e}");
            return ExitCode::from(2);
        }
        (_, Err(e)) => {
            eprintln!("embed: the queue {e}");
            return ExitCode::from(2);
        }
    };
    match run(&dsn, queue).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("embed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(dsn: &Dsn, queue: QueueId) -> Result<(), Box<dyn std::error::Error>> {
    let consumer = ConsumerName::new("customer-notices".to_owned())?;
    let store = Store::connect(dsn, consumer, queue.clone(), StoreOptions::default()).await?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = match TaskEvent::parse(line.as_bytes(), &queue) {
            Ok(event) => event,
            Err(rejection) => {
                println!("event=- error=rejected:{}", rejection.kind());
                continue;
            }
        };
        match store.apply_with(&event, &Notify).await {
            Ok(outcome) => println!("event={} outcome={}", event.id(), outcome.kind()),
            Err(e) => println!("event={} error={}", event.id(), e.kind()),
        }
    }
    store.close().await;
    Ok(())
}
