//! Relay overhead: simple queries per second through commit-proxy and directly to the same
//! throwaway server, at concurrency 1 and 4, in one run.
//!
//! Three paths to one throwaway server: direct; through a plain byte-for-byte TCP forwarder
//! (the floor any userspace proxy pays for the extra hop on this machine); and through the
//! `commit-proxy` binary, a process of its own as other teams run it. Criterion reports the time
//! per query of each; the summary at the end measures all of them again in alternating rounds
//! and prints the throughput ratios docs/commit-proxy.md quotes. Run with `make bench-proxy` (or `cargo bench -p commit-proxy`).

use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use sqlx::{Connection, Executor, MySqlConnection};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use tokio::runtime::Runtime;

struct Setup {
    runtime: Runtime,
    direct: String,
    proxied: String,
    /// Through a plain TCP forwarder: the floor any proxy on this machine pays for the hop.
    forwarded: String,
    _forwarder: std::thread::JoinHandle<()>,
    _proxy: ProxyProcess,
    _server: testdb::Server,
}

/// The `commit-proxy` binary as other teams run it: a process of its own.
struct ProxyProcess(Child);

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn setup() -> Setup {
    let server = testdb::Server::start().expect("a throwaway MySQL server");
    eprintln!("relay bench: server {}", server.description());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_commit-proxy"))
        .args(["--upstream", &server.address()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("commit-proxy starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listen = line
        .trim()
        .strip_prefix("listening=")
        .expect("listening=ADDR")
        .to_owned();
    let direct = server.admin_url().expose().to_owned();
    let proxied = direct.replace(&server.address(), &listen);
    let (forwarder, forward_addr) = tcp_forwarder(server.address());
    let forwarded = direct.replace(&server.address(), &forward_addr);
    Setup {
        runtime,
        direct,
        proxied,
        forwarded,
        _forwarder: forwarder,
        _proxy: ProxyProcess(child),
        _server: server,
    }
}

/// A byte-for-byte TCP forwarder on its own thread: no protocol, just the extra hop.
fn tcp_forwarder(upstream: String) -> (std::thread::JoinHandle<()>, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap().to_string()).unwrap();
            loop {
                let (mut client, _) = listener.accept().await.unwrap();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let mut server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
    });
    (handle, rx.recv().unwrap())
}

async fn connections(url: &str, n: usize) -> Vec<MySqlConnection> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut c = MySqlConnection::connect(url).await.unwrap();
        c.execute("SELECT 1").await.unwrap();
        out.push(c);
    }
    out
}

/// Runs `total` queries spread over `conns`, all connections at once; the elapsed time.
async fn run(conns: &mut [MySqlConnection], total: u64) -> Duration {
    let per = total.div_ceil(conns.len() as u64);
    let started = Instant::now();
    let tasks = conns.iter_mut().map(|c| async move {
        for _ in 0..per {
            c.execute("SELECT 1").await.unwrap();
        }
    });
    futures_join_all(tasks).await;
    started.elapsed()
}

/// A tiny join-all, to avoid a dependency for one call.
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let futures: Vec<_> = futures.map(Box::pin).collect();
    let mut pending: Vec<_> = futures.into_iter().map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for slot in pending.iter_mut() {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    all = false;
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

fn relay(c: &mut Criterion) {
    let s = setup();
    let mut group = c.benchmark_group("select_1");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for concurrency in [1usize, 4] {
        for (name, url) in [
            ("direct", &s.direct),
            ("tcp-forward", &s.forwarded),
            ("proxied", &s.proxied),
        ] {
            let mut conns = s.runtime.block_on(connections(url, concurrency));
            group.bench_function(format!("{name}/c{concurrency}"), |b| {
                b.iter_custom(|iters| s.runtime.block_on(run(&mut conns, iters)))
            });
        }
    }
    group.finish();
    summary(&s);
}

/// Alternating rounds of every configuration; prints queries per second and the ratios.
fn summary(s: &Setup) {
    const ROUNDS: usize = 5;
    const QUERIES: u64 = 4000;
    let mut lines = Vec::new();
    for concurrency in [1usize, 4] {
        let mut direct = s.runtime.block_on(connections(&s.direct, concurrency));
        let mut forwarded = s.runtime.block_on(connections(&s.forwarded, concurrency));
        let mut proxied = s.runtime.block_on(connections(&s.proxied, concurrency));
        let (mut d, mut f, mut p) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..ROUNDS {
            d += s.runtime.block_on(run(&mut direct, QUERIES));
            f += s.runtime.block_on(run(&mut forwarded, QUERIES));
            p += s.runtime.block_on(run(&mut proxied, QUERIES));
        }
        let qps = |t: Duration| (ROUNDS as u64 * QUERIES) as f64 / t.as_secs_f64();
        lines.push(format!(
            "concurrency {concurrency}: direct {:.0} q/s, tcp-forward {:.0} q/s, commit-proxy {:.0} q/s; \
             commit-proxy/direct {:.2}, tcp-forward/direct {:.2}, commit-proxy/tcp-forward {:.2}",
            qps(d),
            qps(f),
            qps(p),
            qps(p) / qps(d),
            qps(f) / qps(d),
            qps(p) / qps(f),
        ));
    }
    println!(
        "\nrelay summary (SELECT 1, {ROUNDS}×{QUERIES} queries per configuration, alternating):"
    );
    for line in lines {
        println!("  {line}");
    }
}

criterion_group!(benches, relay);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
