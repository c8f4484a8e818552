//! The schema `receiver init` creates, read back from information_schema (R-SCHEMA).

use fixtures::ReceiverDb;
use sqlx::{MySqlConnection, Row};

fn has_cjk(s: &str) -> bool {
    s.chars()
        .any(|c| ('\u{4E00}'..='\u{9FFF}').contains(&c) || ('\u{3400}'..='\u{4DBF}').contains(&c))
}

async fn strings(conn: &mut MySqlConnection, sql: &str, db: &str) -> Vec<Vec<String>> {
    sqlx::query(sql)
        .bind(db)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| {
            (0..row.len())
                .map(|i| {
                    row.try_get::<String, _>(i).unwrap_or_else(|_| {
                        String::from_utf8_lossy(&row.try_get::<Vec<u8>, _>(i).unwrap()).into()
                    })
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn two_tables_seventeen_columns_chinese_comments_no_foreign_keys() {
    let rdb = ReceiverDb::new().await;
    let db = rdb.db.receiver_db.clone();
    let mut admin = rdb.admin().await;

    let tables = strings(
        &mut admin,
        "SELECT table_name, engine, table_collation, table_comment FROM information_schema.tables \
         WHERE table_schema = ? ORDER BY table_name",
        &db,
    )
    .await;
    // The data lives in two tables; the other two hold the schema's own version and its
    // migration lock (schema/migrations.sql).
    let names: Vec<&str> = tables.iter().map(|t| t[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "receiver_inbox",
            "receiver_schema_lock",
            "receiver_schema_versions",
            "receiver_task_views"
        ],
        "{tables:?}"
    );
    for t in &tables {
        assert_eq!(t[1], "InnoDB", "{t:?}");
        assert!(t[2].starts_with("utf8mb4"), "{t:?}");
        assert!(has_cjk(&t[3]), "table comment is not Chinese: {t:?}");
    }

    let columns = strings(
        &mut admin,
        "SELECT table_name, column_name, data_type, column_comment FROM information_schema.columns \
         WHERE table_schema = ? ORDER BY table_name, ordinal_position",
        &db,
    )
    .await;
    let (data, ledger): (Vec<_>, Vec<_>) = columns
        .into_iter()
        .partition(|c| !c[0].starts_with("receiver_schema_"));
    for c in &ledger {
        assert!(has_cjk(&c[3]), "column comment is not Chinese: {c:?}");
    }
    let columns = data;
    assert_eq!(columns.len(), 17, "{columns:?}");
    for c in &columns {
        assert!(has_cjk(&c[3]), "column comment is not Chinese: {c:?}");
        assert_ne!(c[2].to_lowercase(), "json", "no JSON column type: {c:?}");
        assert_ne!(
            c[2].to_lowercase(),
            "longtext",
            "no JSON alias (MariaDB's JSON is LONGTEXT): {c:?}"
        );
    }
    // Identity columns compare byte for byte.
    for c in columns.iter().filter(|c| {
        matches!(
            c[1].as_str(),
            "consumer_name" | "queue_id" | "event_id" | "task_id" | "last_event_id"
        )
    }) {
        assert_eq!(c[2], "varbinary", "{c:?}");
    }

    let fks = strings(
        &mut admin,
        "SELECT constraint_name FROM information_schema.table_constraints \
         WHERE constraint_schema = ? AND constraint_type = 'FOREIGN KEY'",
        &db,
    )
    .await;
    assert!(fks.is_empty(), "{fks:?}");
    let refs = strings(
        &mut admin,
        "SELECT constraint_name FROM information_schema.referential_constraints \
         WHERE constraint_schema = ?",
        &db,
    )
    .await;
    assert!(refs.is_empty(), "{refs:?}");

    let keys = strings(
        &mut admin,
        "SELECT table_name, GROUP_CONCAT(column_name ORDER BY seq_in_index) FROM information_schema.statistics \
         WHERE table_schema = ? AND non_unique = 0 AND table_name NOT LIKE 'receiver\\_schema\\_%' \
         GROUP BY table_name, index_name ORDER BY table_name",
        &db,
    )
    .await;
    assert_eq!(
        keys,
        vec![
            vec![
                "receiver_inbox".to_owned(),
                "consumer_name,queue_id,event_id".to_owned()
            ],
            vec![
                "receiver_task_views".to_owned(),
                "consumer_name,queue_id,task_id".to_owned()
            ],
        ]
    );
}

#[test]
fn the_chinese_model_describes_the_same_seventeen_fields() {
    let model = include_str!("../../../../schema/model.zh.md");
    let ddl = result_inbox::schema::SCHEMA_SQL;
    let mut fields = 0;
    for line in ddl.lines() {
        let line = line.trim_start();
        if line.contains(" COMMENT '") && !line.starts_with("COMMENT") {
            let name = line.split_whitespace().next().unwrap();
            assert!(
                model.contains(&format!("| `{name}` |")),
                "model.zh.md does not describe {name}"
            );
            fields += 1;
        }
    }
    assert_eq!(fields, 17);
    assert!(model.contains("`receiver_inbox`") && model.contains("`receiver_task_views`"));
}
