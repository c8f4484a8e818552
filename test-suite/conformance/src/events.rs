//! Task events a test builds, as the platform would emit them.

use result_inbox::{QueueId, TaskEvent};

use crate::*;

/// A task event as the platform would send it.
#[derive(Debug, Clone)]
pub struct EventSpec {
    pub id: String,
    pub event_type: String,
    pub state: String,
    pub queue: String,
    pub task: String,
    pub version: String,
    pub occurred_at: String,
    /// Raw JSON text of the result, if any.
    pub result: Option<String>,
}

impl EventSpec {
    /// A `task.cancelled` event.
    pub fn cancelled(id: &str, task: &str, version: u64) -> EventSpec {
        EventSpec {
            id: id.into(),
            event_type: "task.cancelled".into(),
            state: "CANCELLED".into(),
            queue: QUEUE.into(),
            task: task.into(),
            version: version.to_string(),
            occurred_at: "2026-12-02T14:17:05.123Z".into(),
            result: None,
        }
    }

    /// A `task.succeeded` event with `result` (raw JSON text).
    pub fn succeeded(id: &str, task: &str, version: u64, result: &str) -> EventSpec {
        EventSpec {
            event_type: "task.succeeded".into(),
            state: "SUCCEEDED".into(),
            result: Some(result.into()),
            ..EventSpec::cancelled(id, task, version)
        }
    }

    /// The event's JSON text, members in a deliberately non-canonical order with whitespace.
    pub fn json(&self) -> String {
        let mut s = format!(
            "{{ \"task_version\": {}, \"type\": \"{}\", \"id\": \"{}\", \"state\": \"{}\",\n  \"queue_id\": \"{}\", \"task_id\": \"{}\", \"namespace\": \"default\", \"occurred_at\": \"{}\"",
            self.version, self.event_type, self.id, self.state, self.queue, self.task, self.occurred_at
        );
        if let Some(r) = &self.result {
            s.push_str(", \"result\": ");
            s.push_str(r);
        }
        s.push_str(" }");
        s
    }

    /// The validated event, for the queue it names.
    pub fn event(&self) -> TaskEvent {
        let queue = QueueId::new(self.queue.clone()).expect("valid queue");
        TaskEvent::parse(self.json().as_bytes(), &queue)
            .unwrap_or_else(|e| panic!("test event is invalid: {e}"))
    }
}
