//! The events the canonical-form benchmarks measure, shared by `benches/canonical.rs` and
//! `examples/canon_instructions.rs` so that timings and instruction counts read the same bytes.

/// The three sizes measured: about 1 KiB, 64 KiB and (just under the limit) 512 KiB.
pub const SIZES: [(&str, usize); 3] =
    [("1KiB", 1024), ("64KiB", 64 * 1024), ("512KiB", 510 * 1024)];

/// A task event of about `target` bytes.
pub fn event(target: usize) -> Vec<u8> {
    let mut items = Vec::new();
    let mut i = 0u64;
    let mut size = 0;
    while size < target.saturating_sub(400) {
        let item = format!(
            r#"{{"sku":"SKU-{i:06}","name":"Widget \"{i}\" – größe {i} 组件","qty":{q},"price":{p}.{c:02}0,"total":123456789012345678901234567{d:03},"ratio":{i}.5e-3,"tags":["a\\tb","c/d","é😀"],"ok":{ok},"note":null,"dims":{{"w":{w},"h":{h},"unit":"mm"}}}}"#,
            q = i % 17 + 1,
            p = i % 997,
            c = i % 100,
            d = i % 1000,
            ok = i % 2 == 0,
            w = i * 3,
            h = i * 7
        );
        size += item.len() + 1;
        items.push(item);
        i += 1;
    }
    let body = format!(
        r#"{{ "type": "task.succeeded", "id": "evt-bench", "namespace": "default", "queue_id": "inbox-demo",
  "task_id": "task-bench", "task_version": 7, "state": "SUCCEEDED", "occurred_at": "2026-12-02T22:17:05.123456+08:00",
  "result": {{ "order": {{ "items": [{}], "currency": "EUR", "customer": {{ "id": 42, "name": "Zoë" }} }} }} }}"#,
        items.join(",")
    );
    assert!(
        body.len() <= result_inbox::canonical::MAX_EVENT_BYTES,
        "{}",
        body.len()
    );
    body.into_bytes()
}
