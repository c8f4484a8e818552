//! Groups in `consume`: deliveries that become ready while an apply runs are applied together,
//! in one transaction ([`result_inbox::Store::apply_group`]), up to `RECEIVER_GROUP_MAX`.
//!
//! Groups form from load alone, never from a timer. A worker takes the oldest waiting delivery
//! and every delivery waiting behind it, up to the group size and
//! [`result_inbox::GROUP_MAX_BYTES`], and applies them at once. The lead worker takes whatever
//! waits as soon as it is free: an idle receiver therefore applies a single delivery as soon as
//! it comes, with nothing added to its latency, and under a backlog what arrives during one
//! group's transaction makes the next group. The other workers (one, or more when the
//! concurrency is many groups wide) help only when a full group is waiting, or when the oldest
//! delivery has waited [`STALLED`]: a group held up (by a lock, a slow commit) does not hold
//! back the deliveries behind it, and otherwise groups are not split into smaller ones that
//! cost a transaction each.
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
use std::time::Duration;

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

/// How long the oldest delivery waits for the lead worker before another worker takes it: far
/// below any lease, and above a durable commit's time (a semi-synchronous one included), so
/// that helpers step in for a group held up, not for one committing.
pub const STALLED: Duration = Duration::from_millis(100);

/// What waits for a worker, and the workers.
struct Groups {
    waiting: Mutex<VecDeque<Job>>,
    /// A delivery came: for the lead worker.
    ready: Notify,
    /// A full group is waiting: for the other workers.
    full: Notify,
    max: usize,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// One delivery's event waiting for a group, and where its answer goes.
struct Job {
    event: TaskEvent,
    deadline: Instant,
    since: Instant,
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
            full: Notify::new(),
            max,
            workers: Mutex::new(Vec::new()),
        });
        // As many workers as full groups fit in the concurrency, and a helper at least.
        let workers = concurrency.div_ceil(max).max(2).min(concurrency.max(1));
        let handles = (0..workers)
            .map(|k| {
                let role = if k == 0 { Role::Lead } else { Role::Helper };
                tokio::spawn(work(store.clone(), groups.clone(), metrics.clone(), role))
            })
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
        let waiting = {
            let mut waiting = groups.waiting.lock().expect("not poisoned");
            waiting.push_back(Job {
                event,
                deadline,
                since: Instant::now(),
                answer,
            });
            waiting.len()
        };
        groups.ready.notify_one();
        if waiting >= groups.max {
            groups.full.notify_one();
        }
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

/// Which deliveries a worker takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Whatever waits, as soon as it is free.
    Lead,
    /// A full group, or deliveries that waited [`STALLED`].
    Helper,
}

/// A worker: takes the oldest waiting delivery and what waits behind it (as its role allows),
/// applies them as one group, answers each; then the next.
async fn work(store: Arc<Store>, groups: Arc<Groups>, metrics: Metrics, role: Role) {
    loop {
        let jobs = loop {
            let (taken, left) = {
                let mut waiting = groups.waiting.lock().expect("not poisoned");
                let due = match role {
                    Role::Lead => true,
                    Role::Helper => {
                        waiting.len() >= groups.max
                            || waiting
                                .front()
                                .is_some_and(|j| j.since.elapsed() >= STALLED)
                    }
                };
                let taken = if due {
                    take(&mut waiting, groups.max)
                } else {
                    Vec::new()
                };
                (taken, waiting.len())
            };
            if left >= groups.max {
                groups.full.notify_one();
            }
            if !taken.is_empty() {
                break taken;
            }
            match role {
                Role::Lead => groups.ready.notified().await,
                // Woken by a full group, or after a while to look for deliveries held up.
                Role::Helper => {
                    let _ = tokio::time::timeout(STALLED / 2, groups.full.notified()).await;
                }
            }
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
