//! The rolling upgrade, rehearsed: from an inbox made and filled by the last release's
//! receiver (built here from its tag, in this workspace's target directory) to this one, under
//! load, with COMMIT answers dropped on both receivers throughout and `receiver migrate`
//! SIGKILLed mid-step. On one server, and on a three-node Galera cluster (the old receiver on
//! node 1, `migrate` on node 2, the new receiver on node 3). `make upgrade-drill` runs it.
//!
//! The order is the one docs/upgrading.md gives for 0.1.0: `migrate` while the old `consume`
//! keeps applying, the runtime account granted the ledger, the new `consume` joining the old
//! one (same subscription, same `RECEIVER_NAME`), the old one stopped. The new receiver is the
//! fault build with its test-only step (`RECEIVER_TEST_SCHEMA_STEP=instant`, version 3), so
//! that the release and this build differ by a real `ALTER TABLE` for `migrate` to be killed
//! in; the product's own steps end at the version 0.1.0 already has.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use commit_proxy::{Action, RuleSpec};
use fixtures::load::{produce, LOAD_TYPES};
use fixtures::process::{receiver_faults_bin, Barrier, Consumer};
use fixtures::{bare_command, OrbitDev, QUEUE};
use testdb::{Cluster, Provisioned, Server};

/// The release the drill starts from, and the commit its CHANGELOG entry was cut at (the tag
/// `v0.1.0` names it; a clone without tags still has the commit).
const RELEASE: &str = "v0.1.0";
const RELEASE_COMMIT: &str = "005f3aa9360e18a32785aa42193dbd969681f234";
/// The release's receiver, renamed so that it never takes the place of this build's.
const OLD_BIN: &str = "receiver-0_1_0";
/// Where the release's product crates go in its source tree (not `product`: see
/// [`old_receiver`]).
const PRODUCT: &str = "product-0_1_0";

fn note(line: std::fmt::Arguments<'_>) {
    fixtures::note("upgrade", line);
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cmd` to its end; panics with its output when it fails.
fn must(cmd: &mut std::process::Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

/// The last release's `receiver`, built once per run: its sources from git (the tag, or the
/// commit it names), its binary renamed, into this workspace's target directory so that only
/// the release's own crates build.
fn old_receiver() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = root();
        let git = |args: &[&str]| {
            let mut cmd = std::process::Command::new("git");
            cmd.arg("-C").arg(&root).args(args);
            cmd
        };
        let found = git(&["rev-parse", "--verify", "--quiet", &format!("{RELEASE_COMMIT}^{{commit}}")])
            .output()
            .expect("git runs");
        assert!(
            found.status.success(),
            "this clone lacks {RELEASE}'s commit {RELEASE_COMMIT} (a shallow clone?): fetch the whole history (git fetch --unshallow) to run the upgrade drill"
        );
        if let Ok(tag) = git(&["rev-parse", "--verify", "--quiet", &format!("{RELEASE}^{{commit}}")]).output() {
            let named = String::from_utf8_lossy(&tag.stdout).trim().to_owned();
            assert!(
                named.is_empty() || named == RELEASE_COMMIT,
                "the tag {RELEASE} names {named}, not the release's commit {RELEASE_COMMIT}"
            );
        }
        let src = root.join("target/releases").join(RELEASE);
        let marker = src.join(".extracted");
        let layout = format!("{RELEASE_COMMIT} {PRODUCT}");
        if std::fs::read_to_string(&marker).ok().as_deref() != Some(layout.as_str()) {
            let _ = std::fs::remove_dir_all(&src);
            std::fs::create_dir_all(&src).unwrap();
            let archive = root.join("target/releases").join(format!("{RELEASE}.tar"));
            must(
                git(&["archive", "--output"]).arg(&archive).arg(RELEASE_COMMIT),
                "git archive",
            );
            must(
                std::process::Command::new("tar")
                    .arg("-xf")
                    .arg(&archive)
                    .arg("-C")
                    .arg(&src),
                "tar",
            );
            let _ = std::fs::remove_file(&archive);
            // Cargo tells two path crates of one name and version apart by their path relative
            // to their workspace's root: the release's product/endpoint would share this
            // build's artifacts (and overwrite them) under the same target directory. Its
            // product folder gets a name of its own.
            std::fs::rename(src.join("product"), src.join(PRODUCT)).unwrap();
            let root_manifest = src.join("Cargo.toml");
            let text = std::fs::read_to_string(&root_manifest).unwrap();
            std::fs::write(
                &root_manifest,
                text.replace("\"product/", &format!("\"{PRODUCT}/")),
            )
            .unwrap();
            let manifest = src.join(PRODUCT).join("receiver/Cargo.toml");
            let text = std::fs::read_to_string(&manifest).unwrap();
            let named = "[[bin]]\nname = \"receiver\"\npath = \"src/main.rs\"";
            assert!(text.contains(named), "{RELEASE}'s receiver manifest changed shape");
            std::fs::write(
                &manifest,
                text.replace(named, &format!("[[bin]]\nname = \"{OLD_BIN}\"\npath = \"src/main.rs\"")),
            )
            .unwrap();
            std::fs::write(&marker, &layout).unwrap();
        }
        let started = Instant::now();
        let mut cargo = std::process::Command::new("cargo");
        // As a person's shell (and make) runs it: the variables cargo gives its programs would
        // make the nested cargo build everything again. ring's build script watches some of
        // them (CARGO_PKG_NAME among them), so the shared ring and what is above it build
        // again here after the runner's own cargo built them (about 20 s).
        cargo.env_clear();
        #[allow(clippy::disallowed_methods)] // the test hands its own PATH and HOME on
        for var in ["PATH", "HOME", "RUSTUP_HOME", "CARGO_HOME"] {
            if let Some(v) = std::env::var_os(var) {
                cargo.env(var, v);
            }
        }
        cargo
            .current_dir(&src)
            .args(["build", "--locked", "-p", "receiver", "--bin", OLD_BIN, "--target-dir"])
            .arg(root.join("target"));
        must(&mut cargo, &format!("building {RELEASE}'s receiver"));
        note(format_args!(
            "{RELEASE}'s receiver built in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        let bin = root.join("target/debug").join(OLD_BIN);
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
}

/// `url` with its server's address replaced by `via` (a proxy).
fn via(url: &secret::Secret, server: &Server, via: std::net::SocketAddr) -> String {
    url.expose().replace(&server.address(), &via.to_string())
}

/// Arms a dropped COMMIT answer on each proxy in turn, every `every`, until `stop`: both
/// receivers meet lost answers all through the drill. How many were armed.
fn drop_commit_answers(
    proxies: Vec<Arc<commit_proxy::Proxy>>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut armed = 0;
        while !stop.load(Ordering::SeqCst) {
            for p in &proxies {
                // One at a time: rules armed while nothing commits would pile up and then
                // drop a run of answers together.
                if !p.rules().iter().any(|r| r.armed && r.remaining != Some(0)) {
                    p.arm(RuleSpec::new(Action::DropCommitOk).once())
                        .expect("the rule is valid");
                    armed += 1;
                }
                tokio::time::sleep(every).await;
            }
        }
        armed
    })
}

/// How many deliveries a consume's log says it applied.
fn applied(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("classification=applied"))
        .count()
}

/// The drill on `nodes` (one server three times, or three nodes of a cluster): the old
/// receiver's database on node 1, `migrate` through node 2, the new receiver on node 3.
async fn drill(nodes: [&Server; 3], label: &str) {
    let started = Instant::now();
    let old_bin = old_receiver().to_owned();
    let db: Provisioned = nodes[0].provision().await.expect("provisioned");
    // The platform keeps its own tables on node 1 too; its fault API makes the load's
    // duplicates. A lease of 8 s: a delivery whose COMMIT answer was lost comes back soon.
    let orbit = Arc::new(OrbitDev::start_with(
        db,
        &[
            "--enable-fault-api",
            "--lease-seconds",
            "8",
            "--max-attempts",
            "10",
        ],
    ));
    let db = &orbit.db;

    // The inbox as the last release makes it.
    let init = must(
        bare_command(&old_bin)
            .arg("init")
            .env("ORBIT_RECEIVER_DSN", db.init_url_on(nodes[0]).expose()),
        &format!("{RELEASE}'s init"),
    );
    assert!(init.contains("receiver_schema_initialized=true"), "{init}");
    db.grant_runtime().await.expect("runtime grants");

    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, LOAD_TYPES)
        .await
        .expect("subscription")
        .id;
    let proxy = |node: &Server| {
        let address = node.address();
        async move {
            Arc::new(
                commit_proxy::Proxy::start("127.0.0.1:0", &address)
                    .await
                    .expect("the proxy starts"),
            )
        }
    };
    let (old_proxy, new_proxy) = (proxy(nodes[0]).await, proxy(nodes[2]).await);
    let env_on = |url: String| {
        let mut env = orbit.receiver_env_on(&secret::Secret::new(url));
        env.push(("ORBIT_SUBSCRIPTION_ID", sub.to_string()));
        env
    };
    let old_env = env_on(via(
        &db.runtime_url_on(nodes[0]),
        nodes[0],
        old_proxy.local_addr(),
    ));
    let mut new_env = env_on(via(
        &db.runtime_url_on(nodes[2]),
        nodes[2],
        new_proxy.local_addr(),
    ));
    new_env.push(("RECEIVER_TEST_SCHEMA_STEP", "instant".into()));

    let stop_drops = Arc::new(AtomicBool::new(false));
    let drops = drop_commit_answers(
        vec![old_proxy.clone(), new_proxy.clone()],
        Duration::from_millis(600),
        stop_drops.clone(),
    );
    let old = Consumer::start(bare_command(&old_bin), &old_env, &[]);
    let mut rng = fastrand::Rng::with_seed(59);
    let mut tasks = produce(&orbit, &client, &sub, 12, &mut rng, |_| {}).await;

    // migrate through node 2 while the old receiver applies the next batch: the first run is
    // killed after its step's statement, before the step is recorded as applied.
    let batch = {
        let (orbit, client, sub) = (orbit.clone(), client.clone(), sub.clone());
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(60);
            produce(&orbit, &client, &sub, 12, &mut rng, |_| {}).await
        })
    };
    let migrate_env = vec![
        (
            "ORBIT_RECEIVER_DSN",
            db.init_url_on(nodes[1]).expose().to_owned(),
        ),
        ("RECEIVER_TEST_SCHEMA_STEP", "instant".to_owned()),
    ];
    let mut first = Consumer::faulty_command(&["migrate"], &migrate_env, &[(Barrier::StepDone, 1)]);
    first
        .wait_barrier(Barrier::StepDone, Duration::from_secs(60))
        .await;
    // Meanwhile a second run through node 3 (another node of the cluster) waits for the lock
    // the first holds, names it, and gives up at its --lock-wait having changed nothing.
    let mut elsewhere = migrate_env.clone();
    elsewhere[0].1 = db.init_url_on(nodes[2]).expose().to_owned();
    let waited = bare_command(&receiver_faults_bin())
        .args(["migrate", "--lock-wait", "3s"])
        .envs(elsewhere.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&waited.stderr);
    assert_eq!(waited.status.code(), Some(6), "{said}");
    assert!(
        said.contains("waiting for the migration lock: held by receiver"),
        "{said}"
    );
    let first_log = first.sigkill();
    assert!(
        first_log.contains("recorded versions 1 to 2 as recognised"),
        "{RELEASE}'s inbox is recognised as version 2: {first_log}"
    );
    let t = Instant::now();
    let second = Consumer::faulty_command(&["migrate"], &migrate_env, &[]);
    let mut second = second;
    assert!(
        second.ends_within(Duration::from_secs(60)).await.success(),
        "{}",
        second.output()
    );
    let second_log = second.output();
    assert!(
        second_log.contains("schema_version=2 target=3 unfinished_step=3")
            && second_log.contains("took over the migration lock")
            && second_log.contains("recorded step 3 test-drill-column: the table already had it")
            && second_log.contains("migrated from=2 to=3 applied=0 recorded=1"),
        "{second_log}"
    );
    let migrated_in = t.elapsed();
    let old_log_at_migrate = old.output().len();
    tasks.extend(batch.await.expect("the second batch"));

    // The runtime account reads the ledger from now on (docs/upgrading.md).
    db.grant_runtime().await.expect("the ledger granted");
    fixtures::eventually(
        Duration::from_secs(30),
        "the runtime account reads the ledger on node 3",
        || {
            let url = db.runtime_url_on(nodes[2]);
            async move {
                let Ok(mut conn) =
                    <sqlx::MySqlConnection as sqlx::Connection>::connect(url.expose()).await
                else {
                    return false;
                };
                sqlx::query("SELECT 1 FROM receiver_schema_versions LIMIT 1")
                    .execute(&mut conn)
                    .await
                    .is_ok()
            }
        },
    )
    .await;
    let new = Consumer::start(bare_command(&receiver_faults_bin()), &new_env, &[]);
    tasks.extend(produce(&orbit, &client, &sub, 12, &mut rng, |_| {}).await);
    let old_log = old.stop().await;
    tasks.extend(produce(&orbit, &client, &sub, 8, &mut rng, |_| {}).await);
    fixtures::all_acked(&client, &sub, None, Duration::from_secs(240)).await;
    stop_drops.store(true, Ordering::SeqCst);
    let armed = drops.await.expect("the dropper ran");
    let new_log = new.stop().await;

    // The release's other programs on the migrated schema: prune reads and deletes as before
    // (its dry run here), inspect reads.
    let pruned = must(
        bare_command(&old_bin)
            .args(["prune", "--older-than", "30d", "--dry-run"])
            .envs(
                fixtures::prune_env(&db.prune_url())
                    .iter()
                    .map(|(k, v)| (*k, v.as_str())),
            ),
        &format!("{RELEASE}'s prune on the migrated schema"),
    );
    let inspected = must(
        bare_command(&old_bin)
            .args(["inspect", "--task-id", &tasks[0]])
            .envs(
                old_env
                    .iter()
                    .filter(|(k, _)| *k != "ORBIT_URL")
                    .map(|(k, v)| (*k, v.as_str())),
            ),
        &format!("{RELEASE}'s inspect on the migrated schema"),
    );
    assert!(inspected.contains("applied"), "{inspected}");
    let mut admin = fixtures::admin_in_sync(&db.admin_receiver_url_on(nodes[2])).await;
    let ledger = fixtures::check_ledger(&mut admin, &client, &sub, &tasks, label)
        .await
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let fired = old_proxy.events(0).len() + new_proxy.events(0).len();
    let old_after = applied(&old_log[old_log_at_migrate.min(old_log.len())..]);
    assert!(
        old_after > 0,
        "{RELEASE}'s receiver applied nothing on the migrated schema: the drill proved nothing about it"
    );
    assert!(applied(&new_log) > 0, "the new receiver applied nothing");
    assert!(fired > 0, "no COMMIT answer was dropped");
    assert!(
        !new_log.contains("older than this receiver"),
        "the new receiver ran on an older schema: {new_log}"
    );
    note(format_args!(
        "{label}: {RELEASE}'s prune --dry-run: {}",
        pruned.trim()
    ));
    note(format_args!(
        "{label}: {} deliveries of {} events ({} stale) ACKED once each, 0 violations; {RELEASE} applied {} ({} after the migration), the new receiver {}; {} COMMIT answers dropped of {armed} armed; migrate resumed and finished in {:.1} s after the kill; {:.1} s in all",
        ledger.deliveries,
        ledger.events,
        ledger.stale,
        applied(&old_log),
        old_after,
        applied(&new_log),
        fired,
        migrated_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_from_the_last_release_on_one_server() {
    let server = Server::start().unwrap_or_else(|e| panic!("a server of the drill's own: {e}"));
    drill([&server, &server, &server], "one server").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_from_the_last_release_on_galera() {
    if let Err(e) = testdb::galera_provider() {
        #[allow(clippy::disallowed_methods)] // CI must never skip the drill
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(!ci, "CI=true and no Galera cluster can start: {e}");
        note(format_args!("SKIPPED: {e}"));
        return;
    }
    let cluster = Cluster::start(3).unwrap_or_else(|e| panic!("the cluster starts: {e}"));
    note(format_args!(
        "3 nodes Synced in {:.1} s",
        cluster.started_in().as_secs_f64()
    ));
    drill(
        [cluster.node(0), cluster.node(1), cluster.node(2)],
        "galera",
    )
    .await;
}
