//! Groups in `consume`: deliveries that become ready while an apply runs are applied together,
//! in one transaction ([`result_inbox::Store::apply_group`]), up to `RECEIVER_GROUP_MAX`.
//!
//! Groups form from load alone, never from a timer. A few workers (two, or more when the
//! concurrency is many groups wide) each take the oldest waiting delivery and every delivery
//! waiting behind it, up to the group size and [`result_inbox::GROUP_MAX_BYTES`], and apply them
//! at once. An idle receiver therefore applies a single delivery as soon as it comes, with
//! nothing added to its latency; under a backlog, what arrives during one group's transaction
//! makes the next group.
//!
//! A delivery joins a group only if its apply may take as long as the group's: the group ends by
//! the earliest deadline of its members (each delivery's lease minus the margin for the ACK),
//! which is its first member's, since deliveries wait in the order they came. One whose
//! deadline is earlier waits to lead the next group instead.
//!
//! Each delivery keeps its own answer and its own ACK: the handler that handed it over waits
//! for its group's COMMIT to be answered, then decides on the ACK, logs its line and counts its
//! metrics exactly as an ungrouped apply does.

use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use result_inbox::store::NoWrite;
use result_inbox::{Applied, ApplyError, Member, Store, TaskEvent, GROUP_MAX_BYTES};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::delivery::{self, Handled};
use crate::metrics::Metrics;

/// How `consume` applies a validated event: alone, or in a group with what else is waiting.
/// Derefs to the store, for what is not an apply.
#[derive(Clone)]
pub struct Applier {
    store: Arc<Store>,
    groups: Option<Arc<Groups>>,
}

impl Deref for Applier {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.store
    }
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("grouped", &self.groups.is_some())
            .finish_non_exhaustive()
    }
}

/// What waits for a worker, and the workers.
struct Groups {
    waiting: Mutex<VecDeque<Job>>,
    ready: Notify,
    max: usize,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// One delivery's event waiting for a group, and where its answer goes.
struct Job {
    event: TaskEvent,
    deadline: Instant,
    answer: oneshot::Sender<(TaskEvent, Applied)>,
}

impl Applier {
    /// Applies each event alone, in a transaction of its own.
    pub fn alone(store: Arc<Store>) -> Applier {
        Applier {
            store,
            groups: None,
        }
    }

    /// Applies events in groups of up to `max` (`1`: alone), for `concurrency` deliveries at
    /// once, counting each group in `metrics`.
    pub fn grouped(store: Arc<Store>, max: usize, concurrency: usize, metrics: Metrics) -> Applier {
        if max <= 1 {
            return Applier::alone(store);
        }
        let groups = Arc::new(Groups {
            waiting: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            max,
            workers: Mutex::new(Vec::new()),
        });
        // Two groups in flight: one commits while the next forms and runs. More only when the
        // concurrency is wider than two full groups.
        let workers = concurrency.div_ceil(max).max(2).min(concurrency.max(1));
        let handles = (0..workers)
            .map(|_| tokio::spawn(work(store.clone(), groups.clone(), metrics.clone())))
            .collect();
        *groups.workers.lock().expect("not poisoned") = handles;
        Applier {
            store,
            groups: Some(groups),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Validates `raw` for the store's queue and applies it by `deadline`; how to report it.
    pub async fn apply_raw(&self, raw: &[u8], deadline: Instant) -> Handled {
        match delivery::parse(raw, self.store.queue()) {
            Ok(event) => self.apply(event, deadline).await,
            Err(rejected) => rejected,
        }
    }

    /// Applies `event` by `deadline`, alone or in a group; how to report it.
    pub async fn apply(&self, event: TaskEvent, deadline: Instant) -> Handled {
        let Some(groups) = &self.groups else {
            return delivery::apply(&self.store, &event, Some(deadline)).await.1;
        };
        let id = event.id().to_string();
        let (answer, answered) = oneshot::channel();
        groups.waiting.lock().expect("not poisoned").push_back(Job {
            event,
            deadline,
            answer,
        });
        groups.ready.notify_one();
        match answered.await {
            Ok((event, applied)) => Handled::of(&event, &applied.result, applied.reasons),
            // The worker was stopped mid-group (the receiver is stopping): whether the group
            // committed is not known, so the delivery is not ACKed and comes back.
            Err(_) => Handled::of_id(id, &Err(ApplyError::CommitUnconfirmed), Default::default()),
        }
    }

    /// Stops the group workers (a group in flight is abandoned: its deliveries are not ACKed).
    pub fn stop(&self) {
        if let Some(groups) = &self.groups {
            for worker in groups.workers.lock().expect("not poisoned").drain(..) {
                worker.abort();
            }
        }
    }
}

/// A worker: takes the oldest waiting delivery and what waits behind it, applies them as one
/// group, answers each; then the next.
async fn work(store: Arc<Store>, groups: Arc<Groups>, metrics: Metrics) {
    loop {
        let jobs = loop {
            let taken = take(
                &mut groups.waiting.lock().expect("not poisoned"),
                groups.max,
            );
            if !taken.is_empty() {
                break taken;
            }
            groups.ready.notified().await;
        };
        let members: Vec<Member<'_>> = jobs
            .iter()
            .map(|job| Member {
                event: &job.event,
                write: &NoWrite,
                deadline: Some(job.deadline),
            })
            .collect();
        let done = store.apply_group(&members).await;
        drop(members);
        metrics.group(jobs.len(), done.fallback);
        for (job, applied) in jobs.into_iter().zip(done.results) {
            // A handler cancelled meanwhile (a stop) no longer listens: nothing to do.
            let _ = job.answer.send((job.event, applied));
        }
    }
}

/// The oldest waiting job and those behind it that may share its group: up to `max`, within
/// [`GROUP_MAX_BYTES`], none whose deadline comes before the first's.
fn take(waiting: &mut VecDeque<Job>, max: usize) -> Vec<Job> {
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let end = first.deadline;
    let mut bytes = first.event.canonical().len();
    let mut group = vec![first];
    while group.len() < max {
        let Some(next) = waiting.front() else { break };
        let size = next.event.canonical().len();
        if next.deadline < end || bytes + size > GROUP_MAX_BYTES {
            break;
        }
        bytes += size;
        group.extend(waiting.pop_front());
    }
    group
}
