//! Cases on the receiver's tables themselves: what `init` creates, and identities compared
//! byte for byte.

use std::time::Duration;

use orbit_sdk::DeliveryId;

use crate::world::*;
use crate::*;
use fixtures::QUEUE;

/// Where the contract says what this case checks.
const SCHEMA: &str = "docs/receiver-contract.md, \"The schema the kit checks\"";
/// Where the contract lists the lines the kit reads.
const OUTPUT_READ: &str = "docs/receiver-contract.md, \"The output the kit reads\"";

/// The 17 columns of schema/schema.sql, by table.
const COLUMNS: [(&str, &str); 17] = [
    ("receiver_inbox", "consumer_name"),
    ("receiver_inbox", "queue_id"),
    ("receiver_inbox", "event_id"),
    ("receiver_inbox", "event_digest"),
    ("receiver_inbox", "event_canonical"),
    ("receiver_inbox", "applied"),
    ("receiver_inbox", "received_at"),
    ("receiver_task_views", "consumer_name"),
    ("receiver_task_views", "queue_id"),
    ("receiver_task_views", "task_id"),
    ("receiver_task_views", "task_version"),
    ("receiver_task_views", "last_event_id"),
    ("receiver_task_views", "last_state"),
    ("receiver_task_views", "last_result"),
    ("receiver_task_views", "applied_events"),
    ("receiver_task_views", "created_at"),
    ("receiver_task_views", "updated_at"),
];

pub(crate) async fn schema(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let out = w.init().await?;
    ensure!(
        out.lines()
            .any(|l| l.trim() == "receiver_schema_initialized=true foreign_keys=0"),
        "R-SCHEMA-5: `init` did not print `receiver_schema_initialized=true foreign_keys=0` on a line of its own ({OUTPUT_READ}): {}",
        last_lines(&w, &out)
    );
    let mut c = w.admin().await;
    let db = w.db().receiver_db.clone();
    // Only the receiver's two tables: any other (a migration tool's own, say) is allowed.
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(table_name AS CHAR), CAST(table_comment AS CHAR) FROM information_schema.tables \
         WHERE table_schema = ? AND table_name IN ('receiver_inbox', 'receiver_task_views') \
         ORDER BY table_name",
    )
    .bind(&db)
    .fetch_all(&mut c)
    .await
    .expect("tables listed");
    let names: Vec<&str> = tables.iter().map(|(t, _)| t.as_str()).collect();
    ensure!(
        names == ["receiver_inbox", "receiver_task_views"],
        "R-SCHEMA-1: `init` must create receiver_inbox and receiver_task_views; the database holds {names:?} of them ({SCHEMA})"
    );
    for (t, comment) in &tables {
        ensure!(
            !comment.trim().is_empty(),
            "R-SCHEMA-1: table {t} has no comment ({SCHEMA})"
        );
    }
    let columns: Vec<(String, String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT CAST(table_name AS CHAR), CAST(column_name AS CHAR), CAST(column_comment AS CHAR), \
         CAST(data_type AS CHAR), CAST(collation_name AS CHAR) FROM information_schema.columns \
         WHERE table_schema = ? AND table_name IN ('receiver_inbox', 'receiver_task_views')",
    )
    .bind(&db)
    .fetch_all(&mut c)
    .await
    .expect("columns listed");
    let mut names: Vec<String> = columns
        .iter()
        .map(|(t, c, ..)| format!("{t}.{c}"))
        .collect();
    names.sort();
    let mut expected: Vec<String> = COLUMNS.iter().map(|(t, c)| format!("{t}.{c}")).collect();
    expected.sort();
    ensure!(
        names == expected,
        "R-SCHEMA-1: the two tables must have the 17 columns of schema/schema.sql; missing {:?}, extra {:?} ({SCHEMA})",
        expected.iter().filter(|c| !names.contains(c)).collect::<Vec<_>>(),
        names.iter().filter(|c| !expected.contains(c)).collect::<Vec<_>>()
    );
    for (t, col, comment, ..) in &columns {
        ensure!(
            !comment.trim().is_empty(),
            "R-SCHEMA-1: column {t}.{col} has no comment ({SCHEMA})"
        );
    }
    let identity = [
        ("receiver_inbox", "consumer_name"),
        ("receiver_inbox", "queue_id"),
        ("receiver_inbox", "event_id"),
        ("receiver_task_views", "consumer_name"),
        ("receiver_task_views", "queue_id"),
        ("receiver_task_views", "task_id"),
    ];
    for (t, col) in identity {
        let Some((.., data_type, collation)) =
            columns.iter().find(|(ct, cc, ..)| ct == t && cc == col)
        else {
            return Err(format!("R-SCHEMA-2/3: {t} has no column {col}"));
        };
        let binary = matches!(data_type.as_str(), "varbinary" | "binary")
            || collation.as_deref().is_some_and(|c| c.ends_with("_bin"));
        ensure!(
            binary,
            "R-SCHEMA-7: identity column {t}.{col} is {data_type} with collation {}: identities must compare byte for byte (a binary collation or VARBINARY; {SCHEMA})",
            collation.as_deref().unwrap_or("none")
        );
    }
    // Foreign keys on the two tables, or pointing at them; other tables' own are theirs.
    let fks: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.referential_constraints WHERE constraint_schema = ? \
         AND (table_name IN ('receiver_inbox', 'receiver_task_views') \
              OR referenced_table_name IN ('receiver_inbox', 'receiver_task_views'))",
    )
    .bind(&db)
    .fetch_one(&mut c)
    .await
    .expect("foreign keys counted");
    ensure!(
        fks == 0,
        "R-SCHEMA-1: {fks} foreign key(s) on or to the receiver's tables; there must be none ({SCHEMA})"
    );

    let env = w.env(&w.db().init_url());
    let mut again = w.spawn("init", &env);
    let status = again.wait_within(Duration::from_secs(60)).await;
    ensure!(
        status.is_some_and(|s| !s.success()),
        "R-SCHEMA-5: a second `init` must fail on the existing tables; it {}",
        status.map_or("was still running after 60 s".into(), |s| format!(
            "exited {s}"
        ))
    );
    let after: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = ? \
         AND table_name IN ('receiver_inbox', 'receiver_task_views')",
    )
    .bind(&db)
    .fetch_one(&mut c)
    .await
    .expect("columns counted");
    ensure!(
        after == 17,
        "R-SCHEMA-5: the refused second `init` changed the structure ({after} columns)"
    );
    Ok("2 tables, 17 commented columns, 0 foreign keys, byte-compared identities; second init refused".into())
}

pub(crate) async fn names_by_bytes(ctx: Ctx) -> Verdict {
    const OTHER: &str = "KIT-RECEIVER";
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let _a = w.running().await?;
    let second = w
        .client
        .create_subscription(QUEUE, TYPES)
        .await
        .expect("a second subscription")
        .id;
    let mut env = w.env(&w.dsn.clone());
    for (k, v) in &mut env {
        match *k {
            "RECEIVER_NAME" => *v = OTHER.into(),
            "ORBIT_SUBSCRIPTION_ID" => *v = second.to_string(),
            _ => {}
        }
    }
    let _b = w.consume_with(&env);
    let (task, key) = w.cancelled_task().await;
    let ids: Vec<DeliveryId> = w.deliveries_of(&key).await;
    let theirs: Vec<DeliveryId> = w
        .client
        .list_deliveries(&second, &Default::default())
        .await
        .expect("deliveries listed")
        .into_iter()
        .map(|d| d.id)
        .collect();
    w.acked(&ids, Duration::from_secs(30), "R-STORE-7").await?;
    w.acked(&theirs, Duration::from_secs(30), "R-STORE-7")
        .await?;
    let mut c = w.admin().await;
    let views: Vec<(Vec<u8>, u64)> = sqlx::query_as(
        "SELECT consumer_name, applied_events FROM receiver_task_views WHERE task_id = ? ORDER BY consumer_name",
    )
    .bind(&task)
    .fetch_all(&mut c)
    .await
    .expect("views read");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM receiver_inbox WHERE event_id = ?")
        .bind(&key)
        .fetch_one(&mut c)
        .await
        .expect("inbox counted");
    let names: Vec<String> = views
        .iter()
        .map(|(n, applied)| format!("{}={applied}", String::from_utf8_lossy(n)))
        .collect();
    ensure!(
        rows == 2 && views.len() == 2 && views.iter().all(|(_, n)| *n == 1),
        "R-SCHEMA-7: consumers {RECEIVER_NAME} and {OTHER} each took the event, but the database holds {rows} inbox row(s) and views {names:?}: identities must compare byte for byte, or distinct names collide on the unique key"
    );
    Ok(format!(
        "{RECEIVER_NAME} and {OTHER}: two inbox rows, two views ({})",
        names.join(", ")
    ))
}
