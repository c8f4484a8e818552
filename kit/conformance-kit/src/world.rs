//! One case's world: its databases, its platform and subscription, the receiver's runs in it,
//! and what the kit reads back from the platform and the two tables.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use orbit_sdk::{DeliveryId, SubscriptionId};
use secret::Secret;
use sqlx::{Connection, MySqlConnection};
use testdb::{Provisioned, Server};

use super::*;
use fixtures::process::Proc;
use fixtures::{poll, OrbitDev, QUEUE};

/// One case's world.
pub(crate) struct World {
    pub(crate) receiver: String,
    pub(crate) orbit: OrbitDev,
    pub(crate) client: orbit_sdk::Client,
    pub(crate) sub: SubscriptionId,
    /// The namespace of the platform's credentials (the one injected events name).
    pub(crate) namespace: String,
    /// Where consume connects: the database, or a proxy in front of it.
    pub(crate) dsn: Secret,
    pub(crate) dir: PathBuf,
    pub(crate) runs: usize,
    /// Every output of the receiver in this world, for the secrets check.
    pub(crate) logs: Vec<PathBuf>,
    /// Where those outputs are copied when the world ends (the case's log directory).
    pub(crate) keep: Option<PathBuf>,
    /// Secrets a case gave the receiver besides the world's own (a wrong password, say): the
    /// scan at the world's end looks for them too.
    pub(crate) extra_secrets: Vec<String>,
    /// Markers a case put inside the results it sent: the receiver must print no part of a
    /// result body, so the scan looks for each marker alone too.
    pub(crate) markers: Vec<String>,
    /// Every `consume` this world started, to tell when one ended by itself.
    pub(crate) consumers: Vec<fixtures::process::Watch>,
    /// The receiver's databases on a server of the case's own, when it stops that server
    /// (the platform's stay on the shared one); dropped last, server after databases.
    pub(crate) own: Option<(Provisioned, Server)>,
    /// What the case's run found: this world adds to it as it ends.
    found: std::sync::Arc<Findings>,
}

/// The attempt budget of a case's platform unless the case names one: no such case is about
/// an exhausted budget, and the crash loop's kills must not spend one.
pub(crate) const BUDGET: u32 = 20;

/// Leases of `seconds`, the fault API on, and a budget of `budget` attempts.
pub(crate) fn platform_args(seconds: u64, budget: u32) -> Vec<String> {
    vec![
        "--enable-fault-api".into(),
        "--lease-seconds".into(),
        seconds.to_string(),
        "--max-attempts".into(),
        budget.to_string(),
    ]
}

/// Before the platform stops: what this world found (an exit, a leak, refused ACKs), added to
/// the findings of the case that made it ([`Findings`]), so that a case can name that cause.
impl Drop for World {
    fn drop(&mut self) {
        // Before the scratch directory goes with the platform: a case may have several worlds,
        // so each copy is named by the world's platform port and the run.
        if let Some(keep) = &self.keep {
            if !self.logs.is_empty() && std::fs::create_dir_all(keep).is_ok() {
                let world = self.orbit.url.rsplit(':').next().unwrap_or("0").to_owned();
                for log in &self.logs {
                    if let Some(name) = log.file_name() {
                        let _ = std::fs::copy(
                            log,
                            keep.join(format!("world-{world}-{}", name.to_string_lossy())),
                        );
                    }
                }
            }
        }
        // A consume that ended by itself, seen as its process went: the case fails for that
        // first, whatever it was waiting for.
        if let Some(ended) = self.consume_ended() {
            self.found.exit(ended);
        }
        // Every line the receiver printed in this world, whatever the case was about, against
        // every secret and every result body the case sent.
        let (proofs, results) = self.sent_blocking();
        let mut secrets = self.secrets();
        secrets.extend(results);
        for log in &self.logs {
            let out = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(leak) = leak_in(&out, &secrets, &proofs) {
                let name = log.file_name().unwrap_or_default().to_string_lossy();
                self.found.leak(format!("{leak} (in its output {name})"));
            }
        }
        let refused = self
            .orbit
            .metric("orbit_acks_total{result=\"refused\"}")
            .unwrap_or(0);
        self.found.refused(refused);
    }
}

impl World {
    pub(crate) async fn start(ctx: &Ctx, lease: u64) -> World {
        Self::start_with(ctx, lease, BUDGET).await
    }

    /// A world whose platform gives each delivery `budget` attempts.
    pub(crate) async fn start_with(ctx: &Ctx, lease: u64, budget: u32) -> World {
        Self::started(ctx, lease, budget, &[]).await
    }

    /// A world whose platform also gets `platform` (orbit-dev serve's flags).
    pub(crate) async fn started(ctx: &Ctx, lease: u64, budget: u32, platform: &[&str]) -> World {
        let db = fixtures::ReceiverDb::provisioned().await;
        Self::on(ctx, lease, budget, db, None, platform).await
    }

    /// A world whose receiver database is on a local server of its own.
    pub(crate) async fn with_own_server(ctx: &Ctx, lease: u64, budget: u32) -> World {
        let server = Server::local().expect("a local server of the case's own");
        let own = server.provision().await.expect("databases provisioned");
        let db = fixtures::ReceiverDb::provisioned().await;
        Self::on(ctx, lease, budget, db, Some((own, server)), &[]).await
    }

    pub(crate) async fn on(
        ctx: &Ctx,
        lease: u64,
        budget: u32,
        db: Provisioned,
        own: Option<(Provisioned, Server)>,
        platform: &[&str],
    ) -> World {
        let mut args = platform_args(lease, budget);
        args.extend(platform.iter().map(|a| (*a).to_owned()));
        // Each world's platform writes its events another way, drawn from the run's seed, the
        // case and the world's number within it.
        args.push("--vary-events".into());
        args.push(ctx.world_seed().to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // The platform's database lives beside the receiver's (testdb provisions both).
        let dsn = own.as_ref().map_or(&db, |(own, _)| own).runtime_url();
        let orbit = OrbitDev::start_with(db, &args);
        let client = orbit.client();
        let sub = client
            .create_subscription(QUEUE, TYPES)
            .await
            .expect("subscription created")
            .id;
        let dir = orbit
            .credentials_file
            .parent()
            .expect("a scratch directory")
            .to_path_buf();
        let namespace = orbit.credentials().namespace;
        World {
            receiver: ctx.receiver.clone(),
            namespace,
            orbit,
            client,
            sub,
            dsn,
            dir,
            runs: 0,
            logs: Vec::new(),
            keep: ctx.logs.clone(),
            extra_secrets: Vec::new(),
            markers: Vec::new(),
            consumers: Vec::new(),
            own,
            found: ctx.findings(),
        }
    }

    /// The documented environment, with `dsn` as the receiver's database.
    /// The receiver's databases and accounts.
    pub(crate) fn db(&self) -> &Provisioned {
        self.own.as_ref().map_or(&self.orbit.db, |(db, _)| db)
    }

    /// The server of the case's own.
    pub(crate) fn own_server(&self) -> &Server {
        &self.own.as_ref().expect("a server of the case's own").1
    }

    pub(crate) fn env(&self, dsn: &Secret) -> Vec<(&'static str, String)> {
        vec![
            ("ORBIT_URL", self.orbit.url.clone()),
            (
                "ORBIT_CREDENTIALS_FILE",
                self.orbit.credentials_file.display().to_string(),
            ),
            ("ORBIT_RECEIVER_DSN", dsn.expose().to_owned()),
            ("ORBIT_SUBSCRIPTION_ID", self.sub.to_string()),
            ("RECEIVER_NAME", RECEIVER_NAME.to_owned()),
        ]
    }

    /// The receiver's command line with `command` (`init`, `consume`), run with `sh -c` in a
    /// process group of its own, so that a signal reaches whatever the command line starts
    /// (`go run` included).
    pub(crate) fn spawn(&mut self, command: &str, env: &[(&'static str, String)]) -> Proc {
        self.runs += 1;
        let log = self
            .dir
            .join(format!("receiver-{}-{command}.log", self.runs));
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("{} \"$@\"", self.receiver))
            .arg("receiver")
            .arg(command)
            .env_clear()
            .envs(inherited())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null());
        self.logs.push(log.clone());
        Proc::start_group(cmd, log)
    }

    /// A `commit-proxy` in front of the receiver's database, which consume connects through
    /// from now on.
    pub(crate) async fn behind_proxy(&mut self) -> commit_proxy::Proxy {
        let proxy = commit_proxy::Proxy::start("127.0.0.1:0", self.db().address())
            .await
            .expect("the proxy starts");
        self.dsn = Secret::new(
            self.db()
                .runtime_url()
                .expose()
                .replace(self.db().address(), &proxy.local_addr().to_string()),
        );
        proxy
    }

    /// [`World::behind_proxy`], with every COMMIT's answer held `delay_ms` by the proxy (the
    /// statement runs at once; its answer waits), so that applies last that long at least.
    pub(crate) async fn behind_proxy_answering_commits_late(
        &mut self,
        delay_ms: u64,
    ) -> commit_proxy::Proxy {
        let proxy = self.behind_proxy().await;
        proxy
            .arm(commit_proxy::RuleSpec::new(commit_proxy::Action::Delay {
                delay_ms,
            }))
            .expect("the rule arms");
        proxy
    }

    /// Sends the first event (`task.started`, version 1) of `n` new tasks, named from `name`,
    /// the run's seed and their number: each task, its event's id and its deliveries.
    pub(crate) fn first_events(
        &self,
        name: &str,
        n: usize,
        seed: u64,
    ) -> Vec<(String, String, Vec<DeliveryId>)> {
        (0..n)
            .map(|i| {
                let task = format!("{name}-task-{i}-{seed:x}");
                let id = format!("{name}-{i}-{seed:x}");
                let deliveries = self.send(&self.event(&id, &task, 1, "task.started")).1;
                (task, id, deliveries)
            })
            .collect()
    }

    /// Waits (20 s at most) until event `event`'s inbox row is committed.
    pub(crate) async fn committed(&self, event: &str) -> Result<(), String> {
        let row = poll(
            Duration::from_secs(20),
            Duration::from_millis(20),
            || async {
                if let Some(ended) = self.consume_ended() {
                    return Some(Err(ended));
                }
                (!self.inbox(event).await.is_empty()).then_some(Ok(()))
            },
        )
        .await;
        row.unwrap_or_else(|| {
            Err("R-STORE-7: no inbox row for the delivered event within 20 s".into())
        })
    }

    /// `CMD init` as the account that may create tables, then the runtime grants.
    pub(crate) async fn init(&mut self) -> Result<String, String> {
        let env = self.env(&self.db().init_url());
        let mut p = self.spawn("init", &env);
        let status = p.wait_within(Duration::from_secs(60)).await;
        let out = p.output();
        ensure!(
            status.is_some_and(|s| s.success()),
            "R-SCHEMA-5: `init` did not succeed ({}): {}",
            status.map_or("still running after 60 s".into(), |s| s.to_string()),
            last_lines(self, &out)
        );
        self.db().grant_runtime().await.expect("runtime grants");
        Ok(out)
    }

    pub(crate) fn consume(&mut self) -> Proc {
        let env = self.env(&self.dsn.clone());
        self.consume_with(&env)
    }

    /// A `consume` with `env`, watched like [`World::consume`]'s: one that ends by itself
    /// while the case needs it fails the case.
    pub(crate) fn consume_with(&mut self, env: &[(&'static str, String)]) -> Proc {
        let p = self.spawn("consume", env);
        self.consumers.push(p.watch());
        p
    }

    /// A `consume` of this world that ended by itself (no signal from the kit) while the case
    /// still needed it: the one line a wait fails with at once, instead of a time-out blamed on
    /// another rule.
    pub(crate) fn consume_ended(&self) -> Option<String> {
        self.consumers.iter().find_map(|w| {
            let (status, after) = w.ended_by_itself()?;
            let out = std::fs::read_to_string(w.log()).unwrap_or_default();
            Some(format!(
                "R-CLI-3: consume exited by itself ({status}) within {:.1} s of its start, while the case still needed it (consume runs until SIGINT or SIGTERM); its last lines: {}",
                after.as_secs_f64(),
                last_lines(self, &out)
            ))
        })
    }

    /// What the receiver must never print: the platform token, the database passwords it was
    /// given, and whatever the case added; each with the rule that forbids it and its name.
    pub(crate) fn secrets(&self) -> Vec<(&'static str, &'static str, String)> {
        let mut out = vec![
            (
                "R-SDK-3",
                "the platform token",
                self.orbit.credentials().token.expose().to_owned(),
            ),
            (
                "R-STORE-11",
                "a database password",
                self.db().runtime.password.expose().to_owned(),
            ),
            (
                "R-STORE-11",
                "a database password",
                self.db().init.password.expose().to_owned(),
            ),
        ];
        for extra in &self.extra_secrets {
            out.push(("R-STORE-11", "a database password", extra.clone()));
        }
        for marker in &self.markers {
            out.push((
                "R-STORE-11",
                "a result body the case sent (its marker)",
                marker.clone(),
            ));
        }
        out.retain(|(_, _, s)| !s.is_empty());
        out
    }

    /// The SHA-256 of every lease proof the platform handed out or accepted in this world.
    pub(crate) async fn proof_hashes(&self) -> BTreeSet<Vec<u8>> {
        let mut c = self.platform().await;
        let proofs: Vec<ProofRow> = sqlx::query_as(
            "SELECT proof_sha256, acked_proof_sha256 FROM orbit_deliveries \
                 UNION ALL SELECT proof_sha256, NULL FROM orbit_issued_proofs",
        )
        .fetch_all(&mut c)
        .await
        .expect("proof hashes read");
        proofs
            .into_iter()
            .flat_map(|(a, b)| [a, b])
            .flatten()
            .collect()
    }

    /// [`World::proof_hashes`] and [`World::result_bodies`] from a world's drop: only on the
    /// kit's multi-threaded runtime (none elsewhere).
    fn sent_blocking(&self) -> (BTreeSet<Vec<u8>>, Vec<Forbidden>) {
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| {
                    h.block_on(async { (self.proof_hashes().await, self.result_bodies().await) })
                })
            }
            _ => (BTreeSet::new(), Vec::new()),
        }
    }

    /// Every result body this world's platform sent (each event's `result` member as
    /// delivered, and in the canonical form), as secrets the receiver must never print
    /// (R-STORE-11). Bodies under [`RESULT_SCAN_MIN`] bytes are left out: too short to be
    /// told from an id or a word of a log line.
    pub(crate) async fn result_bodies(&self) -> Vec<Forbidden> {
        let mut c = self.platform().await;
        let bodies: Vec<(Vec<u8>,)> = sqlx::query_as("SELECT body FROM orbit_events")
            .fetch_all(&mut c)
            .await
            .unwrap_or_default();
        let mut out = BTreeSet::new();
        for (body,) in bodies {
            let Some(raw) = result_member(&body) else {
                continue;
            };
            if let Ok((canonical, _)) = canonical_form::canonicalize(raw.as_bytes()) {
                out.insert(String::from_utf8_lossy(&canonical).into_owned());
            }
            out.insert(raw);
        }
        out.into_iter()
            .filter(|b| b.len() >= RESULT_SCAN_MIN)
            .map(|b| ("R-STORE-11", "a result body the case sent", b))
            .collect()
    }

    /// `fut`, unless a `consume` of this world ends by itself first: then the one line that
    /// says so ([`World::consume_ended`]), at once, instead of a time-out blamed on another rule.
    pub(crate) async fn or_ended<T>(
        &self,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T, String> {
        let ended = async {
            loop {
                if let Some(e) = self.consume_ended() {
                    break e;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            v = fut => Ok(v),
            e = ended => Err(e),
        }
    }

    /// Sets up the tables and starts consume.
    pub(crate) async fn running(&mut self) -> Result<Proc, String> {
        self.init().await?;
        Ok(self.consume())
    }

    pub(crate) async fn admin(&self) -> MySqlConnection {
        MySqlConnection::connect(self.db().admin_receiver_url().expose())
            .await
            .expect("an admin connection to the receiver's database")
    }

    pub(crate) async fn platform(&self) -> MySqlConnection {
        MySqlConnection::connect(self.orbit.db.platform_url().expose())
            .await
            .expect("a connection to the platform's database")
    }

    /// Submits and cancels a task: one `task.cancelled` event at version 2. Task and event id.
    pub(crate) async fn cancelled_task(&self) -> (String, String) {
        let task = fixtures::cancelled_task(&self.client).await;
        let event = self.wait_event_of(&task, "task.cancelled").await;
        (task, event)
    }

    /// The id of `task`'s event of `event_type` (its platform key).
    pub(crate) async fn wait_event_of(&self, task: &str, event_type: &str) -> String {
        let found = poll(
            Duration::from_secs(10),
            Duration::from_millis(50),
            || async {
                self.deliveries()
                    .await
                    .into_iter()
                    .find(|d| d.task_id == task && d.event_type == event_type)
                    .map(|d| d.event_id)
            },
        )
        .await;
        found
            .unwrap_or_else(|| panic!("the platform made no {event_type} delivery for task {task}"))
    }

    pub(crate) async fn deliveries(&self) -> Vec<orbit_sdk::wire::DeliveryInfo> {
        self.client
            .list_deliveries(&self.sub, &Default::default())
            .await
            .expect("deliveries listed")
    }

    pub(crate) async fn delivery(&self, id: &DeliveryId) -> orbit_sdk::wire::DeliveryInfo {
        self.client.get_delivery(id).await.expect("delivery read")
    }

    /// Waits until every delivery in `ids` is ACKED; `Err` names the first that is not.
    pub(crate) async fn acked(
        &self,
        ids: &[DeliveryId],
        within: Duration,
        rule: &str,
    ) -> Result<(), String> {
        // The first delivery not ACKED, or none.
        let first_open = || async {
            for id in ids {
                let d = self.delivery(id).await;
                if d.state != "ACKED" {
                    return Some(d);
                }
            }
            None
        };
        let all = poll(within, Duration::from_millis(100), || async {
            if let Some(ended) = self.consume_ended() {
                return Some(Err(ended));
            }
            first_open().await.is_none().then_some(Ok(()))
        })
        .await;
        let still_open = match all {
            Some(Err(ended)) => return Err(ended),
            Some(Ok(())) => None,
            None => first_open().await,
        };
        let Some(d) = still_open else {
            return Ok(());
        };
        Err(format!(
            "{rule}: delivery {} of event {} is {} after {} attempt(s), not ACKED within {} s{}",
            d.id,
            d.event_id,
            d.state,
            d.attempts,
            within.as_secs(),
            self.expired_cause(&d)
        ))
    }

    /// For an EXPIRED delivery, what the receiver said of it: every attempt failed and the
    /// budget is spent, with the receiver's own last lines naming its event or the delivery
    /// (empty for a delivery in any other state).
    pub(crate) fn expired_cause(&self, d: &orbit_sdk::wire::DeliveryInfo) -> String {
        if d.state != "EXPIRED" {
            return String::new();
        }
        let output: String = self
            .logs
            .iter()
            .filter_map(|log| std::fs::read_to_string(log).ok())
            .collect::<Vec<_>>()
            .join("\n");
        let mut said = lines_naming(&output, &d.event_id);
        if said == NONE_NAMES_IT {
            said = lines_naming(&output, d.id.as_str());
        }
        for (_, _, hidden) in self.secrets() {
            said = said.replace(&hidden, secret::MASK);
        }
        format!(
            ": EXPIRED, each of its {} attempts taken and failed until its budget was spent; the receiver's lines for it: {said}",
            d.attempts
        )
    }

    /// Asks the platform to deliver event `key` again (orbit-dev's `duplicate-event` fault):
    /// the new deliveries.
    pub(crate) fn redeliver(&self, key: &str) -> Vec<DeliveryId> {
        let reply = self.fault(serde_json::json!({"fault": "duplicate-event", "event_id": key}));
        delivery_ids(&reply)
    }

    /// Injects a `task.started` event (`id`, task, version) through orbit-dev's
    /// `inject-event`: its platform key and its deliveries.
    pub(crate) fn inject(
        &self,
        (id, task, version): &(String, String, u64),
    ) -> (String, Vec<DeliveryId>) {
        let body = serde_json::json!({
            "id": id, "type": "task.started", "namespace": self.namespace, "queue_id": QUEUE,
            "task_id": task, "task_version": version, "state": "RUNNING",
            "occurred_at": "2026-12-06T01:02:03.456Z",
        });
        self.inject_body(&body.to_string())
    }

    /// Injects an event whose text is `body`, delivered byte for byte (orbit-dev's
    /// `inject-event`): its platform key and its deliveries.
    pub(crate) fn inject_body(&self, body: &str) -> (String, Vec<DeliveryId>) {
        let reply = self.fault(serde_json::json!({"fault": "inject-event", "body": body}));
        let key = reply["key"].as_str().expect("a platform key").to_owned();
        let deliveries = delivery_ids(&reply);
        (key, deliveries)
    }

    /// Injects `event` ([`Body`]) byte for byte: its platform key and its deliveries.
    pub(crate) fn send(&self, event: &Body) -> (String, Vec<DeliveryId>) {
        self.inject_body(&event.text())
    }

    /// A `task.started`-like event of this world's namespace and queue ([`Body::of`]).
    pub(crate) fn event(&self, id: &str, task: &str, version: u64, kind: &str) -> Body {
        Body::of(&self.namespace, id, task, version, kind)
    }

    /// The deliveries of platform event `event` (its key).
    pub(crate) async fn deliveries_of(&self, event: &str) -> Vec<DeliveryId> {
        self.deliveries()
            .await
            .into_iter()
            .filter(|d| d.event_id == event)
            .map(|d| d.id)
            .collect()
    }

    /// The platform's body of event `key`.
    pub(crate) async fn body(&self, key: &str) -> Vec<u8> {
        let mut c = self.platform().await;
        sqlx::query_scalar("SELECT body FROM orbit_events WHERE id = ?")
            .bind(key)
            .fetch_one(&mut c)
            .await
            .expect("the event's body")
    }

    /// The view of `task`: version, last event id, last state, last result, applied events.
    pub(crate) async fn view(&self, task: &str) -> Option<View> {
        let mut c = self.admin().await;
        let row: Option<ViewRow> = sqlx::query_as(
            "SELECT task_version, last_event_id, last_state, last_result, applied_events \
             FROM receiver_task_views WHERE consumer_name = ? AND queue_id = ? AND task_id = ?",
        )
        .bind(RECEIVER_NAME)
        .bind(QUEUE)
        .bind(task)
        .fetch_optional(&mut c)
        .await
        .expect("the view reads");
        row.map(|(version, event, state, result, applied_events)| View {
            version,
            last_event: String::from_utf8_lossy(&event).into_owned(),
            state: String::from_utf8_lossy(&state).into_owned(),
            result,
            applied_events,
        })
    }

    /// The inbox rows of event id `event`: digest, applied, canonical bytes.
    pub(crate) async fn inbox(&self, event: &str) -> Vec<(Vec<u8>, bool, Vec<u8>)> {
        let mut c = self.admin().await;
        sqlx::query_as(
            "SELECT event_digest, applied, event_canonical FROM receiver_inbox \
             WHERE consumer_name = ? AND queue_id = ? AND event_id = ?",
        )
        .bind(RECEIVER_NAME)
        .bind(QUEUE)
        .bind(event)
        .fetch_all(&mut c)
        .await
        .expect("the inbox reads")
    }

    /// Arms a platform fault; its answer.
    pub(crate) fn fault(&self, body: serde_json::Value) -> serde_json::Value {
        self.orbit.fault(body)
    }

    /// Forges an event from `key` (see orbit-dev's `forge-event`): the id its body carries
    /// and its deliveries.
    pub(crate) fn forge(
        &self,
        key: &str,
        keep_id: bool,
        version: Option<u64>,
    ) -> (String, Vec<DeliveryId>) {
        let mut changes = serde_json::json!({"keep_id": keep_id});
        if let Some(v) = version {
            changes["task_version"] = v.into();
        }
        self.forge_with(key, changes)
    }

    /// [`World::forge`] with any of `forge-event`'s members (`keep_id`, `task_version`,
    /// `queue_id`, `type`) in `changes`.
    pub(crate) fn forge_with(
        &self,
        key: &str,
        changes: serde_json::Value,
    ) -> (String, Vec<DeliveryId>) {
        let mut body = serde_json::json!({"fault": "forge-event", "event_id": key});
        for (k, v) in changes.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        let reply = self.fault(body);
        let id = reply["event_id"].as_str().expect("a forged id").to_owned();
        let deliveries = delivery_ids(&reply);
        (id, deliveries)
    }

    /// Submits and cancels a task and waits until its event's deliveries are ACKED (`rule`
    /// names the failure): the receiver is up and applying. Task and event id.
    pub(crate) async fn cancelled_and_acked(&self, rule: &str) -> Result<(String, String), String> {
        let (task, key) = self.cancelled_task().await;
        self.acked(
            &self.deliveries_of(&key).await,
            Duration::from_secs(30),
            rule,
        )
        .await?;
        Ok((task, key))
    }

    /// Delivery `id` once it is neither PENDING nor LEASED (ACKED, EXPIRED or DISCARDED), or
    /// as it is after `within`.
    pub(crate) async fn settled(
        &self,
        id: &DeliveryId,
        within: Duration,
    ) -> orbit_sdk::wire::DeliveryInfo {
        let ended = poll(within, Duration::from_millis(200), || async {
            let d = self.delivery(id).await;
            (d.state != "LEASED" && d.state != "PENDING").then_some(d)
        })
        .await;
        match ended {
            Some(d) => d,
            None => self.delivery(id).await,
        }
    }

    /// A receiver that applies and ACKs `task`'s cancelled event: the world, its consume,
    /// task and event id.
    pub(crate) async fn first_event(
        ctx: &Ctx,
        lease: u64,
    ) -> Result<(World, Proc, String, String), String> {
        let mut w = World::start(ctx, lease).await;
        let p = w.running().await?;
        let (task, event) = w.cancelled_task().await;
        let ids = w.deliveries_of(&event).await;
        w.acked(&ids, Duration::from_secs(30), "R-STORE-7").await?;
        Ok((w, p, task, event))
    }
}

/// The delivery ids a fault's answer lists (`deliveries`).
fn delivery_ids(reply: &serde_json::Value) -> Vec<DeliveryId> {
    reply["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .filter_map(|d| d.as_str().and_then(|t| DeliveryId::new(t).ok()))
        .collect()
}

/// What the environment of the kit passes on to the receiver: enough to find programs.
pub(crate) fn inherited() -> Vec<(&'static str, String)> {
    ["PATH", "HOME"]
        .into_iter()
        .filter_map(|k| {
            #[allow(clippy::disallowed_methods)] // the kit's own environment, passed on
            std::env::var(k).ok().map(|v| (k, v))
        })
        .collect()
}

/// An event's text, member by member, each a raw JSON value: what a case injects, with any
/// member changed, added or left out (a malformed event is one change away from a good one).
#[derive(Debug, Clone)]
pub(crate) struct Body(Vec<(String, String)>);

impl Body {
    /// An event of `kind` (`task.started`, …) with the state its type requires, for `task` at
    /// `version`, in `namespace` and the kit's queue.
    pub(crate) fn of(namespace: &str, id: &str, task: &str, version: u64, kind: &str) -> Body {
        let state = match kind {
            "task.submitted" => "PENDING",
            "task.succeeded" => "SUCCEEDED",
            "task.failed" => "FAILED",
            "task.cancelled" => "CANCELLED",
            "task.needs_review" => "NEEDS_REVIEW",
            _ => "RUNNING",
        };
        let text = |s: &str| serde_json::Value::from(s).to_string();
        Body(vec![
            ("id".into(), text(id)),
            ("type".into(), text(kind)),
            ("namespace".into(), text(namespace)),
            ("queue_id".into(), text(QUEUE)),
            ("task_id".into(), text(task)),
            ("task_version".into(), version.to_string()),
            ("state".into(), text(state)),
            ("occurred_at".into(), text("2026-12-06T01:02:03.456Z")),
        ])
    }

    /// This event with member `name` set to the raw JSON `raw` (added when absent).
    pub(crate) fn with(mut self, name: &str, raw: impl Into<String>) -> Body {
        let raw = raw.into();
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => *v = raw,
            None => self.0.push((name.into(), raw)),
        }
        self
    }

    /// This event with member `name` set to the string `text`.
    pub(crate) fn with_text(self, name: &str, text: &str) -> Body {
        self.with(name, serde_json::Value::from(text).to_string())
    }

    /// This event without member `name`.
    pub(crate) fn without(mut self, name: &str) -> Body {
        self.0.retain(|(n, _)| n != name);
        self
    }

    /// The raw JSON of member `name`, if the event has one.
    pub(crate) fn member(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The event's text.
    pub(crate) fn text(&self) -> String {
        let members: Vec<String> = self
            .0
            .iter()
            .map(|(n, v)| format!("{}:{v}", serde_json::Value::from(n.as_str())))
            .collect();
        format!("{{{}}}", members.join(","))
    }
}

/// Every column of a view row as text, in [`VIEW_COLUMNS`]' order (`last_result` as its
/// SHA-256, never its bytes), or `None` without a row.
pub(crate) type ViewText = Option<Vec<Option<String>>>;

/// The columns of a view row, in the order [`World::view_text`] reads them.
pub(crate) const VIEW_COLUMNS: [&str; 7] = [
    "task_version",
    "last_event_id",
    "last_state",
    "last_result (its SHA-256)",
    "applied_events",
    "created_at",
    "updated_at",
];

impl World {
    /// Every column of the view of (`consumer`, `queue`, `task`) as text: versions and times
    /// as the server writes them, ids and states as hex, the result as its SHA-256. Read so
    /// for any column type a receiver chose (a signed version, a `TEXT` result).
    pub(crate) async fn view_text(&self, consumer: &str, queue: &str, task: &str) -> ViewText {
        let mut c = self.admin().await;
        let row: Option<sqlx::mysql::MySqlRow> = sqlx::query(
            "SELECT CAST(task_version AS CHAR), HEX(last_event_id), HEX(last_state), \
               SHA2(last_result, 256), CAST(applied_events AS CHAR), CAST(created_at AS CHAR), \
               CAST(updated_at AS CHAR) \
             FROM receiver_task_views WHERE consumer_name = ? AND queue_id = ? AND task_id = ?",
        )
        .bind(consumer)
        .bind(queue)
        .bind(task)
        .fetch_optional(&mut c)
        .await
        .expect("the view reads");
        use sqlx::Row;
        row.map(|r| {
            (0..VIEW_COLUMNS.len())
                .map(|i| {
                    r.try_get::<Option<Vec<u8>>, _>(i)
                        .ok()
                        .flatten()
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                })
                .collect()
        })
    }

    /// [`World::view_text`] of the kit's consumer and queue.
    pub(crate) async fn own_view_text(&self, task: &str) -> ViewText {
        self.view_text(RECEIVER_NAME, QUEUE, task).await
    }
}

/// The columns in which `after` differs from `before`, named, with both values (the result
/// only as its SHA-256's first 12 hex digits).
pub(crate) fn changed_columns(before: &[Option<String>], after: &[Option<String>]) -> String {
    let show = |i: usize, v: &Option<String>| match v {
        None => "NULL".to_owned(),
        Some(v) if i == 3 => v.chars().take(12).collect(),
        Some(v) if i == 1 || i == 2 => hex_text(v),
        Some(v) => v.clone(),
    };
    let changed: Vec<String> = VIEW_COLUMNS
        .iter()
        .enumerate()
        .filter(|(i, _)| before.get(*i) != after.get(*i))
        .map(|(i, name)| {
            format!(
                "{name} {} -> {}",
                show(i, before.get(i).unwrap_or(&None)),
                show(i, after.get(i).unwrap_or(&None))
            )
        })
        .collect();
    changed.join(", ")
}

/// Hex text as the bytes it spells, shown as text (ids and states are printable).
pub(crate) fn hex_text(hex: &str) -> String {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A view row as read: version, last event id, state, result, applied events.
pub(crate) type ViewRow = (u64, Vec<u8>, Vec<u8>, Option<Vec<u8>>, u64);
/// A delivery's current and ACKed proof hashes.
pub(crate) type ProofRow = (Option<Vec<u8>>, Option<Vec<u8>>);

#[derive(PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) version: u64,
    pub(crate) last_event: String,
    pub(crate) state: String,
    pub(crate) result: Option<Vec<u8>>,
    pub(crate) applied_events: u64,
}

/// Everything but the result's bytes (a result body is never printed): their length.
impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("version", &self.version)
            .field("last_event", &self.last_event)
            .field("state", &self.state)
            .field(
                "result",
                &self.result.as_ref().map(|r| format!("{} bytes", r.len())),
            )
            .field("applied_events", &self.applied_events)
            .finish()
    }
}

/// How `stored` differs from `expected`, without printing either (an event or a result body
/// is never printed): their lengths and the first byte where they part.
pub(crate) fn difference(stored: &[u8], expected: &[u8]) -> String {
    let at = stored
        .iter()
        .zip(expected)
        .position(|(a, b)| a != b)
        .unwrap_or(stored.len().min(expected.len()));
    format!(
        "stored {} bytes, expected {} bytes, first difference at byte {at}",
        stored.len(),
        expected.len()
    )
}

/// What `out` (a receiver's output) holds that it must not: one of `secrets` (rule, name,
/// value) or a word whose SHA-256 is one of `proofs` (a lease proof). The message names the
/// rule and what kind of secret, never the secret.
/// What the receiver must never print: the rule that forbids it, what it is, and its text.
pub(crate) type Forbidden = (&'static str, &'static str, String);

/// The shortest result body the leak scan looks for.
pub(crate) const RESULT_SCAN_MIN: usize = 24;

/// The `result` member of an event's body, as its text stands there.
fn result_member(body: &[u8]) -> Option<String> {
    let members: std::collections::BTreeMap<String, &serde_json::value::RawValue> =
        serde_json::from_slice(body).ok()?;
    members.get("result").map(|r| r.get().to_owned())
}

pub(crate) fn leak_in(
    out: &str,
    secrets: &[(&'static str, &'static str, String)],
    proofs: &BTreeSet<Vec<u8>>,
) -> Option<String> {
    if let Some((rule, what, _)) = secrets.iter().find(|(_, _, s)| out.contains(s.as_str())) {
        return Some(format!("{rule}: the receiver printed {what}"));
    }
    let words = out.split(|c: char| !(c.is_ascii_alphanumeric() || "-_+/=.".contains(c)));
    for word in words {
        if word.len() >= 16
            && proofs.contains(result_inbox::Digest::of(word.as_bytes()).0.as_slice())
        {
            return Some("R-SDK-3: the receiver printed a lease proof".into());
        }
    }
    None
}

/// What [`lines_naming`] says when no line names the key.
pub(crate) const NONE_NAMES_IT: &str = "none names it";

/// The receiver's last three lines naming `key`, shortened, or that it printed none.
pub(crate) fn lines_naming(output: &str, key: &str) -> String {
    // A line from its classification on when it names one (the timestamp and level before it
    // tell the reader nothing here), shortened.
    let shown = |l: &str| -> String {
        let from = l.find("classification=").unwrap_or(0);
        l[from..].chars().take(160).collect()
    };
    let lines: Vec<String> = output
        .lines()
        .filter(|l| l.contains(key))
        .map(shown)
        .collect();
    if lines.is_empty() {
        return NONE_NAMES_IT.into();
    }
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// The last three lines of a receiver's output, for a failure message, with the world's
/// token and passwords masked: the kit never repeats a secret a receiver printed.
pub(crate) fn last_lines(w: &World, out: &str) -> String {
    let lines: Vec<&str> = out.lines().rev().take(3).collect();
    let mut text = lines.into_iter().rev().collect::<Vec<_>>().join(" | ");
    for (_, _, hidden) in w.secrets() {
        text = text.replace(&hidden, secret::MASK);
    }
    if text.is_empty() {
        "no output".into()
    } else {
        text
    }
}
