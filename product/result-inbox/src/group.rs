//! The group apply: many events in one READ COMMITTED transaction, each with the outcome that
//! [`Store::apply_until`] alone would have given it had the group's events been applied one
//! after another in version order.
//!
//! # What one group sends
//!
//! | step | statement | round trips |
//! |---|---|---|
//! | open | `BEGIN` | 1 |
//! | after a recent duplicate only: which events are recorded already | [`recorded_ids`] | 0 or 1 |
//! | the dedup claims, in event id order | [`insert_inbox_rows`]: one multi-row plain `INSERT` | 1 |
//! | lock the views that exist, in key order | [`lock_views`]: `SELECT … FOR UPDATE` | 1 |
//! | create the views that did not | [`create_views`]: one multi-row plain `INSERT` | 0 or 1 |
//! | advance the views that did | [`advance_views`]: one multi-row upsert | 0 or 1 |
//! | clear `applied` on the stale events | [`mark_stale_rows`] | 0 or 1 |
//! | the callers' writes, one receipt per event | theirs | theirs |
//! | close | `COMMIT` | 1 |
//!
//! Four to eight round trips and one commit however many events the group holds, where one
//! event alone costs four and a commit. A group of one is applied as one event.
//!
//! # Why it is safe
//!
//! - **Dedup.** The inbox rows go in with a plain `INSERT`, as one event's does: an
//!   uncommitted competitor makes it wait, a committed one fails it (1062). The group never
//!   guesses which row collided: it rolls back and falls back ([`Fallback::Duplicate`]).
//!   After that, while redeliveries keep coming ([`SCREEN_GROUPS`]), a group first reads which
//!   of its events the inbox holds, committed, and answers each of those as its own apply
//!   would (a duplicate, with what its first receipt did); only the others are claimed. A
//!   recorded event whose digest differs makes the group fall back, so that its own apply
//!   reports the conflict.
//! - **The views move forward only.** The views that exist are locked first, in key order,
//!   with what they hold read under the lock; the group's events are then judged against
//!   them in version order ([`judge`]), exactly as one apply after another would judge them.
//!   A view that did not exist is created with a plain `INSERT`: if another transaction
//!   created it meanwhile, the insert fails and the group falls back
//!   ([`Fallback::ViewRace`]) instead of writing over what it did not read (once, after a
//!   first try that met such a view, which the second try then locks and advances). The advance still
//!   carries the one-event upsert's guard (only a higher version moves a view), and each
//!   statement's row count is checked against what the judgement expects.
//! - **No deadlock between groups.** Inbox rows, view locks and created views are each taken
//!   in key order, so two groups wait for each other in one direction only. A deadlock that a
//!   caller's write or a one-event apply still causes is a definite rollback, and the group
//!   restarts as one event's transaction does.
//! - **One poison event costs only itself.** A duplicate, a conflict (the same version with
//!   another event id), a view created meanwhile or a caller's write that fails rolls the
//!   whole group back (nothing of it stays) and each event is then applied alone, in the
//!   group's order, within its own deadline. After a duplicate, which a backlog of
//!   redeliveries after a crash is full of, one read ([`recorded_ids`]) first sets the events
//!   already recorded apart (they go alone and resolve as duplicates), and the rest try once
//!   more as a group.
//! - **COMMIT.** Only an OK to COMMIT confirms the group; without an answer every event of
//!   it is [`ApplyError::CommitUnconfirmed`], resolved by identity on its redelivery. Under
//!   [`crate::StoreOptions::require_replica_ack`] one read of the primary's status covers the
//!   whole group.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::{Executor, MySqlConnection, Row};

use crate::error::{mysql_number, ApplyError, Conflict, StorageError, ER_DUP_ENTRY};
use crate::event::{Rejection, TaskEvent};
use crate::outcome::Outcome;
use crate::seam::{self, Point};
use crate::statements::GroupRule;
use crate::store::{digest_column, Applied, Retries, Store};
use crate::work::{Done, GroupStep, Receipt, Work};
pub use crate::work::{Fallback, Member};
use canonical_form::Digest;

/// The most bytes of stored events one group carries: its inbox `INSERT` stays well below
/// MySQL's and MariaDB's default `max_allowed_packet` (16 MiB and more) with every event at
/// the 512 KiB limit. A caller forming groups stops adding events at this size; a larger
/// group is applied one event at a time ([`Fallback::TooLarge`]).
pub const GROUP_MAX_BYTES: usize = 4 << 20;

/// The most events one group holds: the group's statements bind up to seven values a row,
/// and each group size is one more prepared statement per connection.
pub const GROUP_MAX_EVENTS: usize = 64;

/// After a group meets an event recorded already, this many of the store's next groups read
/// the inbox for their events before claiming them, and answer those recorded as duplicates
/// inside the group: a backlog of redeliveries then costs one read a group, not a rollback and
/// a transaction per redelivery. Each group that meets none counts one off, so that once the
/// redeliveries stop, groups go back to claiming at once.
pub const SCREEN_GROUPS: u32 = 32;

/// What a group apply did: each member's answer, in the members' order, and whether the
/// group fell back to one event at a time (and why).
#[derive(Debug)]
pub struct GroupApplied {
    pub results: Vec<Applied>,
    pub fallback: Option<Fallback>,
}

impl Store {
    /// Records `members` and advances their views in one transaction, each with its own
    /// writes, ending by the earliest member's deadline (and the budget). Each member's
    /// result is what [`Store::apply_until`] would have returned for it, the group's events
    /// taken in version order; a group of one is exactly that call. A member of another
    /// queue is rejected alone. See the module's text for what is sent and why it is safe.
    pub async fn apply_group(&self, members: &[Member<'_>]) -> GroupApplied {
        let (ours, theirs): (Vec<usize>, Vec<usize>) =
            (0..members.len()).partition(|&i| members[i].event.queue() == self.queue());
        let mut results: Vec<Option<Applied>> = members.iter().map(|_| None).collect();
        for i in theirs {
            results[i] = Some(Applied {
                result: Err(ApplyError::Rejected(Rejection::QueueMismatch)),
                retries: 0,
                reasons: Retries::default(),
            });
        }
        let mut fallback = None;
        if let [one] = ours[..] {
            let m = members[one];
            results[one] = Some(self.apply_until(m.event, m.write, m.deadline).await);
        } else if ours.len() > 1 {
            let mut alone: Vec<usize> = Vec::new();
            let screen = self.screen().load(Ordering::Relaxed) > 0;
            let mut tried = self.try_group(members, &ours, screen).await;
            if matches!(tried, Err(Fallback::ViewRace)) {
                // Another transaction created a view this group meant to create, and has
                // committed it: the group's next try locks and advances it instead.
                tried = self.try_group(members, &ours, screen).await;
            }
            match tried {
                Ok(applied) => {
                    let met = applied.iter().any(|a| duplicate(&a.result));
                    self.screened(screen, met);
                    if met && self.statements().group_rule == GroupRule::RestTwice {
                        alone.extend(
                            ours.iter()
                                .zip(&applied)
                                .filter(|(_, a)| !duplicate(&a.result))
                                .map(|(&i, _)| i),
                        );
                    }
                    fill(&mut results, &ours, applied);
                }
                Err(Fallback::Duplicate) => {
                    fallback = Some(Fallback::Duplicate);
                    self.screened(screen, true);
                    // After a crash most of a backlog may be redeliveries: the events already
                    // recorded go alone (each resolves as a duplicate), and the rest try once
                    // more as a group before they go alone too.
                    let (rest, recorded) = self.split_recorded(members, &ours).await;
                    alone = recorded;
                    if rest.len() > 1 && !alone.is_empty() {
                        match self.try_group(members, &rest, false).await {
                            Ok(applied) => {
                                fill(&mut results, &rest, applied);
                                if self.statements().group_rule == GroupRule::RestTwice {
                                    alone.extend(rest);
                                }
                            }
                            Err(_) => alone.extend(rest),
                        }
                    } else {
                        alone.extend(rest);
                    }
                }
                Err(why) => {
                    fallback = Some(why);
                    alone = ours.clone();
                }
            }
            // One at a time, in the order the group judged them, each by its own deadline.
            let chosen: Vec<Member<'_>> = alone.iter().map(|&i| members[i]).collect();
            for k in self.order(&chosen) {
                let (i, m) = (alone[k], chosen[k]);
                results[i] = Some(self.apply_until(m.event, m.write, m.deadline).await);
            }
            if self.statements().group_rule == GroupRule::AnswersAsCommitted {
                answer_as_committed(&mut results);
            }
        }
        GroupApplied {
            results: results
                .into_iter()
                .map(|r| r.expect("every member answered"))
                .collect(),
            fallback,
        }
    }

    /// After a group (`screened`: one that read the inbox first) that met an event already
    /// recorded (`met`), the next [`SCREEN_GROUPS`] groups read the inbox first; each
    /// screened group that meets none counts one of them off.
    fn screened(&self, screened: bool, met: bool) {
        if met {
            self.screen().store(SCREEN_GROUPS, Ordering::Relaxed);
        } else if screened {
            let _ = self
                .screen()
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// `members[which]` as one group (`screen`: reading the inbox first): each one's answer,
    /// in `which`'s order, or why the group must go another way (nothing of it stays).
    async fn try_group(
        &self,
        members: &[Member<'_>],
        which: &[usize],
        screen: bool,
    ) -> Result<Vec<Applied>, Fallback> {
        let group: Vec<Member<'_>> = which.iter().map(|&i| members[i]).collect();
        let bytes: usize = group.iter().map(|m| m.event.canonical().len()).sum();
        if group.len() > GROUP_MAX_EVENTS || bytes > GROUP_MAX_BYTES {
            return Err(Fallback::TooLarge);
        }
        let deadline = group.iter().filter_map(|m| m.deadline).min();
        let (done, reasons) = self
            .run(
                &Work::Group {
                    members: &group,
                    screen,
                },
                deadline,
            )
            .await;
        let each = |result: Result<Outcome, ApplyError>| Applied {
            result,
            retries: reasons.total(),
            reasons,
        };
        match done {
            Ok(Done::Fallback(why)) => Err(why),
            Ok(Done::Group {
                outcomes,
                replicated,
            }) => Ok(outcomes
                .into_iter()
                .map(|o| {
                    each(if replicated {
                        Ok(o)
                    } else {
                        Err(ApplyError::Unreplicated(o))
                    })
                })
                .collect()),
            Ok(Done::One(_)) => unreachable!("a group's run ends as a group"),
            Err(e) => Ok(group.iter().map(|_| each(Err(same_error(&e)))).collect()),
        }
    }

    /// `which` split into the members to try again as a group (not recorded yet, each event
    /// once) and those to apply alone (recorded already, or a second copy of an event). When
    /// the inbox cannot be read, every member goes alone.
    async fn split_recorded(
        &self,
        members: &[Member<'_>],
        which: &[usize],
    ) -> (Vec<usize>, Vec<usize>) {
        let sql = recorded_ids(which.len());
        let ids = which
            .iter()
            .map(|&i| members[i].event.id().as_str().as_bytes());
        let q = self.bind_identity(sqlx::query(&sql), ids);
        let Ok(Ok(rows)) = tokio::time::timeout(self.apply_timeout(), self.read_all(q)).await
        else {
            return (Vec::new(), which.to_vec());
        };
        let mut seen: BTreeSet<Vec<u8>> = rows
            .iter()
            .filter_map(|r| r.try_get::<Vec<u8>, _>(0).ok())
            .collect();
        which
            .iter()
            .partition(|&&i| seen.insert(members[i].event.id().as_str().as_bytes().to_vec()))
    }

    /// The order in which the group's events are judged: by task, then version (then
    /// arrival), as if applied one after another oldest first.
    fn order(&self, group: &[Member<'_>]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..group.len()).collect();
        if self.statements().group_rule != GroupRule::ArrivalOrder {
            order.sort_by(|&a, &b| {
                let (x, y) = (group[a].event, group[b].event);
                (x.task().as_str().as_bytes(), x.version(), a).cmp(&(
                    y.task().as_str().as_bytes(),
                    y.version(),
                    b,
                ))
            });
        }
        order
    }

    /// BEGIN … COMMIT for a group (`screen`: reading the inbox first, and answering there
    /// the events it holds already). Returns with the transaction still open on any error and
    /// on a fallback.
    pub(crate) async fn group_transaction<'a>(
        &self,
        conn: &mut MySqlConnection,
        members: &'a [Member<'a>],
        screen: bool,
        commit_sent: &AtomicBool,
    ) -> Result<GroupStep<'a>, ApplyError> {
        conn.execute("BEGIN").await?;
        for m in members {
            seam::reach(Point::BeforeInsert, m.event).await;
        }
        let mut outcomes: Vec<Option<Outcome>> = vec![None; members.len()];
        if screen {
            match self.recorded(conn, members).await? {
                Some(verdicts) => {
                    for (k, verdict) in verdicts {
                        outcomes[k] = Some(verdict);
                    }
                }
                // A recorded event whose content differs: its own apply reports the conflict.
                None => return Ok(GroupStep::Fallback(Fallback::Duplicate)),
            }
        }
        let fresh: Vec<usize> = (0..members.len())
            .filter(|&k| outcomes[k].is_none())
            .collect();
        if !fresh.is_empty() {
            let chosen: Vec<Member<'_>> = fresh.iter().map(|&k| members[k]).collect();
            match self.record_group(conn, &chosen).await? {
                Ok(recorded) => {
                    for (&k, outcome) in fresh.iter().zip(recorded) {
                        outcomes[k] = Some(outcome);
                    }
                }
                Err(why) => return Ok(GroupStep::Fallback(why)),
            }
        }

        for m in members {
            seam::reach(Point::BeforeCommit, m.event).await;
        }
        commit_sent.store(true, Ordering::SeqCst);
        match conn.execute("COMMIT").await {
            Ok(_) => Ok(GroupStep::Committed(
                outcomes
                    .into_iter()
                    .map(|o| o.expect("every member judged"))
                    .collect(),
            )),
            // The server answered COMMIT with an error: a definite failure, nothing committed.
            Err(e @ sqlx::Error::Database(_)) => Err(e.into()),
            // No answer: the outcome is unknown, for every event of the group.
            Err(_) => Err(ApplyError::CommitUnconfirmed),
        }
    }

    /// Inside a group's transaction: which of `members` the inbox holds already, committed,
    /// each answered as a duplicate with what its first receipt did; `None` when one of them
    /// was recorded with other content.
    async fn recorded(
        &self,
        conn: &mut MySqlConnection,
        members: &[Member<'_>],
    ) -> Result<Option<Vec<(usize, Outcome)>>, ApplyError> {
        let sql = recorded_ids(members.len());
        let ids = members.iter().map(|m| m.event.id().as_str().as_bytes());
        let rows = self
            .bind_identity(sqlx::query(&sql), ids)
            .fetch_all(&mut *conn)
            .await?;
        let mut held: BTreeMap<Vec<u8>, (Digest, bool)> = BTreeMap::new();
        for row in rows {
            held.insert(row.try_get(0)?, (digest_column(&row, 1)?, row.try_get(2)?));
        }
        let mut verdicts = Vec::new();
        for (k, m) in members.iter().enumerate() {
            match held.get(m.event.id().as_str().as_bytes()) {
                None => {}
                Some((digest, applied)) if *digest == m.event.digest() => {
                    verdicts.push((k, Outcome::Duplicate { applied: *applied }));
                }
                Some(_) => return Ok(None),
            }
        }
        Ok(Some(verdicts))
    }

    /// `q` with this store's consumer name and queue bound, then `keys`.
    fn bind_identity<'q>(
        &'q self,
        q: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
        keys: impl Iterator<Item = &'q [u8]>,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        let mut q = q
            .bind(self.consumer().as_str().as_bytes())
            .bind(self.queue().as_str().as_bytes());
        for key in keys {
            q = q.bind(key);
        }
        q
    }

    /// The group's writes, inside its transaction: the dedup claims, the views, the stale
    /// marks and the callers' writes; each member's outcome, or why the group must fall back.
    async fn record_group(
        &self,
        conn: &mut MySqlConnection,
        members: &[Member<'_>],
    ) -> Result<Result<Vec<Outcome>, Fallback>, ApplyError> {
        let consumer = self.consumer().as_str().as_bytes();
        let queue = self.queue().as_str().as_bytes();
        let statements = self.statements();

        // The dedup claims, in event id order.
        let mut by_id: Vec<&TaskEvent> = members.iter().map(|m| m.event).collect();
        by_id.sort_by(|a, b| a.id().as_str().as_bytes().cmp(b.id().as_str().as_bytes()));
        let sql = insert_inbox_rows(statements.insert_inbox_rows, by_id.len());
        let digests: Vec<[u8; 32]> = by_id.iter().map(|e| e.digest().0).collect();
        let mut insert = sqlx::query(&sql);
        for (e, digest) in by_id.iter().zip(&digests) {
            insert = insert
                .bind(consumer)
                .bind(queue)
                .bind(e.id().as_str().as_bytes())
                .bind(&digest[..])
                .bind(e.canonical());
        }
        match insert.execute(&mut *conn).await {
            Ok(r) if r.rows_affected() != by_id.len() as u64 => {
                return Ok(Err(Fallback::Duplicate))
            }
            Ok(_) => {}
            Err(e) if mysql_number(&e) == Some(ER_DUP_ENTRY) => {
                return Ok(Err(Fallback::Duplicate))
            }
            Err(e) => return Err(e.into()),
        }
        for m in members {
            seam::reach(Point::AfterInboxRows, m.event).await;
        }

        // The views that exist, locked in key order, and what they hold.
        let mut tasks: Vec<&[u8]> = members
            .iter()
            .map(|m| m.event.task().as_str().as_bytes())
            .collect();
        tasks.sort();
        tasks.dedup();
        let sql = lock_views(tasks.len());
        let lock = self.bind_identity(sqlx::query(&sql), tasks.iter().copied());
        let mut held: BTreeMap<Vec<u8>, View> = BTreeMap::new();
        for row in lock.fetch_all(&mut *conn).await? {
            let task: Vec<u8> = row.try_get(0)?;
            held.insert(
                task,
                View {
                    version: row.try_get(1)?,
                    event_id: row.try_get(2)?,
                },
            );
        }

        let order = self.order(members);
        let running = statements.group_rule != GroupRule::ArrivalOrder;
        let judged = match judge(members, &order, &held, running) {
            Ok(judged) => judged,
            Err(_conflict) => return Ok(Err(Fallback::Conflict)),
        };

        // The views' new values: per task, the last event judged applied, and how many were.
        let mut created: Vec<(&TaskEvent, u64)> = Vec::new();
        let mut advanced: Vec<(&TaskEvent, u64)> = Vec::new();
        for (task, (last, count)) in &judged.finals {
            if held.contains_key(*task) {
                advanced.push((members[*last].event, *count));
            } else {
                created.push((members[*last].event, *count));
            }
        }
        if !created.is_empty() {
            let sql = create_views(created.len());
            let q = bind_views(sqlx::query(&sql), consumer, queue, &created);
            match q.execute(&mut *conn).await {
                Ok(r) if r.rows_affected() == created.len() as u64 => {}
                Ok(_) => return Err(unexpected("the group's new views were not all created")),
                Err(e) if mysql_number(&e) == Some(ER_DUP_ENTRY) => {
                    return Ok(Err(Fallback::ViewRace))
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !advanced.is_empty() {
            let sql = advance_views(advanced.len());
            let q = bind_views(sqlx::query(&sql), consumer, queue, &advanced);
            // A changed row counts 2 (the driver asks for found rows): every view locked and
            // judged older must have moved.
            let r = q.execute(&mut *conn).await?;
            if r.rows_affected() != 2 * advanced.len() as u64 {
                return Err(unexpected("a view the group advanced did not move"));
            }
        }
        let stale: Vec<&TaskEvent> = order
            .iter()
            .filter(|&&k| judged.outcomes[k] == Outcome::Stale)
            .map(|&k| members[k].event)
            .collect();
        if !stale.is_empty() {
            let sql = mark_stale_rows(stale.len());
            let ids = stale.iter().map(|e| e.id().as_str().as_bytes());
            let r = self
                .bind_identity(sqlx::query(&sql), ids)
                .execute(&mut *conn)
                .await?;
            if r.rows_affected() != stale.len() as u64 {
                return Err(unexpected("a stale event's inbox row was not marked"));
            }
        }
        for m in members {
            seam::reach(Point::AfterViews, m.event).await;
        }

        for &k in &order {
            let receipt = Receipt {
                event: members[k].event,
                outcome: judged.outcomes[k],
            };
            if members[k].write.write(&mut *conn, receipt).await.is_err() {
                return Ok(Err(Fallback::Write));
            }
        }

        Ok(Ok(judged.outcomes))
    }
}

/// What a locked view holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) version: u64,
    pub(crate) event_id: Vec<u8>,
}

/// The group judged against the views it locked: each member's outcome (in the members'
/// order) and, per task that moves, its last applied member and how many applied.
#[derive(Debug)]
pub(crate) struct Judged<'a> {
    pub(crate) outcomes: Vec<Outcome>,
    pub(crate) finals: BTreeMap<&'a [u8], (usize, u64)>,
}

/// Judges the members in `order` against `held`, each against the view as the ones before it
/// left it (`running`; otherwise, only in a mutant store, against the view as locked): a
/// higher version applies, a lower one is stale, the same version and event id is stale (its
/// inbox row was pruned: history only), the same version with another event id is a conflict.
pub(crate) fn judge<'a>(
    members: &'a [Member<'a>],
    order: &[usize],
    held: &BTreeMap<Vec<u8>, View>,
    running: bool,
) -> Result<Judged<'a>, Conflict> {
    let mut now: BTreeMap<&[u8], (u64, &[u8])> = BTreeMap::new();
    let mut outcomes = vec![Outcome::Stale; members.len()];
    let mut finals: BTreeMap<&'a [u8], (usize, u64)> = BTreeMap::new();
    for &k in order {
        let e = members[k].event;
        let task = e.task().as_str().as_bytes();
        let id = e.id().as_str().as_bytes();
        let current = now
            .get(task)
            .copied()
            .filter(|_| running)
            .or_else(|| held.get(task).map(|v| (v.version, v.event_id.as_slice())));
        let applies = match current {
            None => true,
            Some((version, _)) if e.version() > version => true,
            Some((version, _)) if e.version() < version => false,
            Some((_, recorded)) if recorded == id => false,
            Some((version, recorded)) => {
                return Err(Conflict::SameVersionOtherEvent {
                    version,
                    recorded_event: String::from_utf8_lossy(recorded).into_owned(),
                })
            }
        };
        if applies {
            outcomes[k] = Outcome::Applied;
            now.insert(task, (e.version(), id));
            let entry = finals.entry(task).or_insert((k, 0));
            *entry = (k, entry.1 + 1);
        }
    }
    Ok(Judged { outcomes, finals })
}

/// [`GroupRule::AnswersAsCommitted`] (only a mutant store): once one member committed, every
/// member that did not is answered applied.
fn answer_as_committed(results: &mut [Option<Applied>]) {
    let committed = |r: &Option<Applied>| r.as_ref().is_some_and(|a| a.result.is_ok());
    if results.iter().any(committed) {
        for r in results.iter_mut().flatten() {
            if r.result.is_err() {
                r.result = Ok(Outcome::Applied);
            }
        }
    }
}

/// Every member's answer into its place.
fn fill(results: &mut [Option<Applied>], which: &[usize], applied: Vec<Applied>) {
    for (&i, a) in which.iter().zip(applied) {
        results[i] = Some(a);
    }
}

/// Whether `result` answers a duplicate (its commit replicated or not).
fn duplicate(result: &Result<Outcome, ApplyError>) -> bool {
    matches!(
        result,
        Ok(Outcome::Duplicate { .. }) | Err(ApplyError::Unreplicated(Outcome::Duplicate { .. }))
    )
}

/// A group-wide error, for one member.
fn same_error(e: &ApplyError) -> ApplyError {
    match e {
        ApplyError::Rejected(r) => ApplyError::Rejected(r.clone()),
        ApplyError::Conflict(c) => ApplyError::Conflict(c.clone()),
        ApplyError::CommitUnconfirmed => ApplyError::CommitUnconfirmed,
        ApplyError::Timeout(d) => ApplyError::Timeout(*d),
        ApplyError::Unreplicated(o) => ApplyError::Unreplicated(*o),
        ApplyError::Storage(s) => ApplyError::Storage(s.clone()),
        // A caller's write failing makes the group fall back; it never ends the group.
        ApplyError::Write(_) => unexpected("a caller's write failed in a group"),
    }
}

fn unexpected(what: &'static str) -> ApplyError {
    ApplyError::Storage(StorageError::unexpected(what))
}

/// Binds the view rows' values: identity, version, the event's id, state and result, and how
/// many of the group's events applied to the view.
fn bind_views<'q>(
    mut q: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    consumer: &'q [u8],
    queue: &'q [u8],
    rows: &[(&'q TaskEvent, u64)],
) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    for (e, count) in rows {
        q = q
            .bind(consumer)
            .bind(queue)
            .bind(e.task().as_str().as_bytes())
            .bind(e.version())
            .bind(e.id().as_str().as_bytes())
            .bind(e.state().as_str().as_bytes())
            .bind(e.result())
            .bind(*count);
    }
    q
}

/// `n` copies of `row`, comma-separated.
fn rows(row: &str, n: usize) -> String {
    vec![row; n].join(", ")
}

/// The group's dedup claims: `n` inbox rows, each binding consumer, queue, event id, digest
/// and stored form (`insert` is the statement's head, [`crate::statements::INSERT_INBOX_HEAD`]).
pub fn insert_inbox_rows(insert: &str, n: usize) -> String {
    format!(
        "{insert} VALUES {}",
        rows("(?, ?, ?, ?, ?, 1, UTC_TIMESTAMP(6))", n)
    )
}

/// Which of `n` events (consumer, queue, then the event ids) the inbox holds, committed, with
/// each one's digest and whether its first receipt applied.
pub fn recorded_ids(n: usize) -> String {
    format!(
        "SELECT event_id, event_digest, applied FROM receiver_inbox \
         WHERE consumer_name = ? AND queue_id = ? AND event_id IN ({})",
        rows("?", n)
    )
}

/// Locks the views of `n` tasks that exist (consumer, queue, then the task ids), in key order,
/// and reads what each holds.
pub fn lock_views(n: usize) -> String {
    format!(
        "SELECT task_id, task_version, last_event_id FROM receiver_task_views \
         WHERE consumer_name = ? AND queue_id = ? AND task_id IN ({}) \
         ORDER BY task_id FOR UPDATE",
        rows("?", n)
    )
}

const VIEW_COLUMNS: &str = "INSERT INTO receiver_task_views \
     (consumer_name, queue_id, task_id, task_version, last_event_id, last_state, last_result, \
      applied_events, created_at, updated_at) VALUES ";
const VIEW_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))";

/// Creates `n` views that did not exist, with their final values. A plain `INSERT`: a view
/// another transaction created meanwhile fails it (1062), and the group falls back.
pub fn create_views(n: usize) -> String {
    format!("{VIEW_COLUMNS}{}", rows(VIEW_ROW, n))
}

/// Advances `n` locked views to their final values, adding how many of the group's events
/// applied to each; still guarded, as the one-event upsert is, so that only a higher version
/// moves a view. Each `IF` compares with the row as it was (`task_version` is set last).
pub fn advance_views(n: usize) -> String {
    format!(
        "{VIEW_COLUMNS}{} ON DUPLICATE KEY UPDATE \
           applied_events = IF(VALUES(task_version) > task_version, applied_events + VALUES(applied_events), applied_events), \
           last_event_id = IF(VALUES(task_version) > task_version, VALUES(last_event_id), last_event_id), \
           last_state = IF(VALUES(task_version) > task_version, VALUES(last_state), last_state), \
           last_result = IF(VALUES(task_version) > task_version, VALUES(last_result), last_result), \
           updated_at = IF(VALUES(task_version) > task_version, VALUES(updated_at), updated_at), \
           task_version = GREATEST(task_version, VALUES(task_version))",
        rows(VIEW_ROW, n)
    )
}

/// Clears the provisional `applied` flag of `n` stale events' inbox rows (consumer, queue,
/// then the event ids).
pub fn mark_stale_rows(n: usize) -> String {
    format!(
        "UPDATE receiver_inbox SET applied = 0 \
         WHERE consumer_name = ? AND queue_id = ? AND event_id IN ({})",
        rows("?", n)
    )
}
