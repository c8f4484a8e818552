//! Proof that a failing run leaves nothing behind: this test binary runs itself on a test that
//! starts a MySQL server, `orbit-dev`, a `receiver-faults` consumer stopped at a barrier, and a
//! bridge with a network namespace (a process inside it, a link into the root namespace), and
//! then fails (a panic) or is killed (SIGKILL). Afterwards none of those processes may be
//! alive and, after a panic, the run's temporary directory must be empty and its namespaces
//! gone; after a SIGKILL the next run's sweep must empty the one and remove the others.

use fixtures::process::Barrier;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fixtures::process::Consumer;
use fixtures::{files_under, subscribed_receiver, QUEUE};

/// Where the doomed run writes the pids of what it started (set by the parent).
const PIDS_VAR: &str = "CONFORMANCE_DOOMED_PIDS";
/// `panic` or `hang` (the parent kills it).
const MODE_VAR: &str = "CONFORMANCE_DOOMED_MODE";

#[allow(clippy::disallowed_methods)] // the test's own switches, set by its parent
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Run only by the tests below, in a child process, where it must fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a deliberately failing run: started by the cleanup tests, which expect it to fail"]
async fn doomed_run() {
    let pids_file = PathBuf::from(var(PIDS_VAR).expect("run by the cleanup tests only"));
    let (orbit, client, _, env) = subscribed_receiver(&[], &["task.cancelled"]).await;
    let task = client.submit_task(QUEUE, None).await.unwrap();
    client.cancel_task(&task.id).await.unwrap();
    let mut consumer = Consumer::faulty(&env, &[(Barrier::AfterCommit, 1)]);
    consumer
        .wait_barrier(Barrier::AfterCommit, Duration::from_secs(20))
        .await;
    let mut pids = vec![consumer.pid(), orbit.pid()];
    pids.extend(testdb::Server::shared().unwrap().pid());
    // A namespace with a process in it, and the root namespace's link into its bridge.
    let net = testdb::netns::Net::create().unwrap();
    let member = net.add("doomed").unwrap();
    net.host_link().unwrap();
    let mut sleeper = member.server_command("sleep");
    sleeper.arg("600");
    pids.push(testdb::spawn_tied(sleeper).unwrap().id());
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    std::fs::write(&pids_file, list.join("\n")).unwrap();
    if var(MODE_VAR).as_deref() == Some("hang") {
        std::future::pending::<()>().await;
    }
    panic!("deliberate failure, with a server, a platform, a consumer and a namespace running");
}

/// Starts the doomed run with its own TMPDIR; the child, that TMPDIR and the pids file.
fn start_doomed(mode: &str) -> (std::process::Child, PathBuf, PathBuf) {
    // Beside the scratch directory, not in it: a MySQL socket path must stay short.
    let tmp = std::env::temp_dir().join(format!("doomed-{mode}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let pids = testdb::scratch_dir()
        .unwrap()
        .join(format!("doomed-{mode}.pids"));
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["cleanup::doomed_run", "--exact", "--ignored", "--nocapture"])
        .env("TMPDIR", &tmp)
        .env(PIDS_VAR, &pids)
        .env(MODE_VAR, mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, tmp, pids)
}

fn read_pids(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// Waits up to 10 s for every pid to be gone.
fn assert_gone(pids: &[u32]) {
    let alive = || -> Vec<&u32> { pids.iter().filter(|p| testdb::process_alive(**p)).collect() };
    let gone = fixtures::poll_blocking(Duration::from_secs(10), Duration::from_millis(50), || {
        alive().is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "still running after the failed run: {:?}",
        alive()
    );
}

/// No namespace and no root link of the run `pid` is left.
fn assert_no_network_of(pid: u32) {
    let namespaces = testdb::netns::namespaces_of(pid);
    assert!(
        namespaces.is_empty(),
        "namespaces left behind: {namespaces:?}"
    );
    let links: Vec<String> = testdb::netns::leftovers()
        .into_iter()
        .filter(|l| l.starts_with(&format!("link rin{pid}x")))
        .collect();
    assert!(links.is_empty(), "links left behind: {links:?}");
}

#[test]
fn a_panicking_run_leaves_no_process_and_no_temporary_file() {
    let (child, tmp, pids_file) = start_doomed("panic");
    let child_pid = child.id();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "the doomed run passed: {text}");
    assert!(text.contains("deliberate failure"), "{text}");
    let pids = read_pids(&pids_file);
    assert_eq!(pids.len(), 4, "server, platform, consumer, sleeper: {text}");
    assert_gone(&pids);
    let left = files_under(&tmp);
    assert!(left.is_empty(), "left behind: {left:?}");
    assert_no_network_of(child_pid);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_killed_run_leaves_no_process_and_the_next_run_sweeps_its_directories() {
    let (mut child, tmp, pids_file) = start_doomed("hang");
    let child_pid = child.id();
    let pids = fixtures::poll_blocking(Duration::from_secs(60), Duration::from_millis(50), || {
        let pids = read_pids(&pids_file);
        assert!(
            pids.len() == 4 || child.try_wait().unwrap().is_none(),
            "the doomed run ended early"
        );
        (pids.len() == 4).then_some(pids)
    })
    .expect("the doomed run did not set up within 60 s");
    // Counted before the kill: namespaces are the machine's, not under our TMPDIR, so once
    // the owner is dead any run's sweep (another suite's, side by side) may take them.
    assert_eq!(
        testdb::netns::namespaces_of(child_pid).len(),
        2,
        "the doomed run made its bridge and member namespaces"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // PR_SET_PDEATHSIG takes the server, the platform, the consumer and the sleeper with it.
    assert_gone(&pids);
    assert!(
        !files_under(&tmp).is_empty(),
        "a killed run cannot clean up: its directories stay until the next run"
    );
    // The next run (here: a process that only asks for a scratch directory) sweeps them.
    let sweep = Command::new(std::env::current_exe().unwrap())
        .args(["cleanup::sweeper", "--exact", "--ignored"])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(sweep.status.success());
    let left = files_under(&tmp);
    assert!(left.is_empty(), "left behind after the sweep: {left:?}");
    assert_no_network_of(child_pid);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Run only by the test above, in a child process: a next run's start-up sweep.
#[test]
#[ignore = "started by a_killed_run_leaves_no_process_and_the_next_run_sweeps_its_directories"]
fn sweeper() {
    testdb::scratch_dir().unwrap();
}
